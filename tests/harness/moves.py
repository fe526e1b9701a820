"""The scene of the move tests (tests/runtime/test_weaved_moves.py on one host,
tests/daemon/test_moves_hosts.py on the cluster of separate hosts): in groups of at
most two, ``a`` and ``c`` share a group and ``b`` gets its own; once ``b`` has trained
``b_version`` steps ``c`` is cancelled, so consolidation moves ``a`` or ``b`` into the
other's group (onto its nodes, or onto a node it must ask for first where ``a`` and ``b``
cannot share one)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import wait_for
from tests.harness.weaved import call, wait_states
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.service import Weaved
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase


def submit(sock: Path, name: str, seed: int, iterations: int, **profile: float) -> int:
    """Submit the toy job (``profile``: job_spec_toml's slo, rollout_s, train_s)."""
    spec = job_spec_toml(name, iterations=iterations, seed=seed, options=OPTIONS,
                         **profile)  # type: ignore[arg-type]
    return int(call(sock, Op.SUBMIT, spec=spec, source=f"{name}.toml")["job"])


def row(w: Weaved, job: int) -> JobRow:
    got = w.store.job(job)
    assert got is not None
    return got


def nodes(w: Weaved, gid: int, job: int) -> set[str]:
    """The nodes ``job`` rolled out or trained on in group ``gid``."""
    spans = getattr(w.driver, "spans", {}).get(gid, [])
    return {s.node for s in spans if s.job_id == str(job) and s.ok
            and s.kind in (Phase.ROLLOUT, Phase.TRAIN)}


def at(w: Weaved, job: int, version: int, timeout_s: float) -> None:
    """Wait until ``job`` has trained ``version`` steps."""
    wait_for(lambda: w.driver.live(job), timeout_s, f"job {job} at version {version}",
             interval_s=0.1, until=lambda live: live is not None
             and (live["version"] or 0) >= version)


def consolidating(w: Weaved, sock: Path, seeds: tuple[int, int, int], iterations: int,
                  b_version: int, timeout_s: float,
                  declared: Mapping[str, Mapping[str, float]] | None = None) -> tuple[int, int]:
    """Sets the scene (``seeds`` of a, b, c; a and b run ``iterations``; ``declared``:
    what each job's spec declares, by name, as :func:`submit` takes it) and cancels
    ``c``: (a, b), each RUNNING in its own group then."""
    of = declared or {}
    a = submit(sock, "a", seeds[0], iterations, **of.get("a", {}))
    c = submit(sock, "c", seeds[2], 10 * iterations, **of.get("c", {}))
    at(w, a, 1, timeout_s)
    b = submit(sock, "b", seeds[1], iterations, **of.get("b", {}))
    wait_states(sock, [b], {"RUNNING"}, timeout_s, [])
    groups = [row(w, j).group_id for j in (a, c, b)]
    assert groups == [1, 1, 2], groups
    at(w, b, b_version, timeout_s)
    assert [row(w, j).state.value for j in (a, b, c)] == ["RUNNING"] * 3
    assert call(sock, Op.CANCEL, jobs=[c])["results"][0]["ok"]
    return a, b


def ended_as_solo(w: Weaved, sock: Path, seeds: dict[int, int], iterations: int,
                  timeout_s: float) -> None:
    """The jobs (job -> seed) complete with the weights of their solo runs."""
    rows = wait_states(sock, list(seeds), {"COMPLETED", "FAILED"}, timeout_s, [])
    assert [r["state"] for r in rows] == ["COMPLETED"] * len(seeds), rows
    for job, seed in seeds.items():
        done = w.driver.live(job)
        assert done is not None and done["version"] == iterations
        solo = run_solo(MemberSpec(str(job), seed=seed, steps=iterations, options=OPTIONS))
        assert done["weights_sha256"] == weights_digest(solo.weights), f"job {job}"


def checkpoint_at(live: dict[str, object]) -> int:
    """The checkpoint version a moved job was re-admitted from (its event's words)."""
    return int(str(live["event"]).rsplit("checkpoint v", 1)[1].split()[0])
