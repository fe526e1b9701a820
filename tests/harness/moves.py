"""The scene of the move tests (tests/runtime/test_weaved_moves.py on one host,
tests/daemon/test_moves_hosts.py on the cluster of separate hosts): in groups of at
most two, ``a`` and ``c`` share a group and ``b`` gets its own; once ``b`` has trained
``b_version`` steps ``c`` is cancelled, so consolidation moves ``a`` or ``b`` into the
other's group (onto its nodes, or onto a node it must ask for first where ``a`` and ``b``
cannot share one). :func:`repinning` sets the scene of the re-pinning move (the
``re_pin`` tests of the same files)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, wait_states
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import GroupPlan, JobRow, MemberPlan
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
                  declared: Mapping[str, Mapping[str, float]] | None = None,
                  a_iterations: int | None = None) -> tuple[int, int]:
    """Sets the scene (``seeds`` of a, b, c; a and b run ``iterations``, a
    ``a_iterations`` where given: enough to outlast b's group's start, as each group
    runs on while another starts; ``declared``: what each job's spec declares, by name,
    as :func:`submit` takes it) and cancels ``c``: (a, b), each RUNNING in its own group
    then."""
    of = declared or {}
    a = submit(sock, "a", seeds[0], a_iterations or iterations, **of.get("a", {}))
    c = submit(sock, "c", seeds[2], 10 * iterations, **of.get("c", {}))
    at(w, a, 1, timeout_s)
    b = submit(sock, "b", seeds[1], iterations, **of.get("b", {}))
    wait_states(sock, [b], {"RUNNING"}, timeout_s, [])
    groups = [row(w, j).group_id for j in (a, c, b)]
    assert groups == [1, 1, 2], groups
    at(w, b, b_version, timeout_s)
    rows = [row(w, j) for j in (a, b, c)]
    assert [r.state.value for r in rows] == ["RUNNING"] * 3, \
        [(r.job_id, r.state.value, r.reason) for r in rows]
    assert call(sock, Op.CANCEL, jobs=[c])["results"][0]["ok"]
    return a, b


def ended_as_solo(w: Weaved, sock: Path, seeds: dict[int, int],
                  iterations: int | Mapping[int, int], timeout_s: float) -> None:
    """The jobs (job -> seed) complete with the weights of their solo runs of
    ``iterations`` (one count, or job -> its count)."""
    rows = wait_states(sock, list(seeds), {"COMPLETED", "FAILED"}, timeout_s, [])
    assert [r["state"] for r in rows] == ["COMPLETED"] * len(seeds), rows
    for job, seed in seeds.items():
        steps = iterations if isinstance(iterations, int) else iterations[job]
        done = w.driver.live(job)
        assert done is not None and done["version"] == steps
        solo = run_solo(MemberSpec(str(job), seed=seed, steps=steps, options=OPTIONS))
        assert done["weights_sha256"] == weights_digest(solo.weights), f"job {job}"


def checkpoint_at(live: dict[str, object]) -> int:
    """The checkpoint version a moved job was re-admitted from (its event's words)."""
    return int(str(live["event"]).rsplit("checkpoint v", 1)[1].split()[0])


@dataclass(frozen=True)
class Repinned:
    """The re-pinning move done: the jobs, c's new group and the nodes e and c rolled
    out on in group 1 before it."""

    a: int
    e: int
    c: int
    new: int
    e_node: str
    c_node: str


def repinning(w: Weaved, sock: Path, seeds: tuple[int, int, int],
              iterations: tuple[int, int], label: Callable[[int], str],
              timeout_s: float) -> Repinned:
    """Groups of three: a (100 s rollouts, SLO 1.5) and e (10 s, SLO 10) share a rollout
    node, c (100 s, SLO 1.5) has its own (``iterations``: of a and e, of c). Once c has
    trained 2 steps a re-plan is committed as weaved's replanner commits one
    (``GroupPlan.then``): c into a new group (``label``: its backend label from its id),
    whose nodes it waits for, and e re-pinned onto c's node once c is out. Group 1 runs
    its plan as it is meanwhile; returns once c has moved and group 1 took its plan."""
    slow = {"rollout_s": 100.0, "slo": 1.5}
    a = submit(sock, "a", seeds[0], iterations[0], **slow)
    e = submit(sock, "e", seeds[1], iterations[0], rollout_s=10.0, slo=10.0)
    c = submit(sock, "c", seeds[2], iterations[1], **slow)
    wait_states(sock, [a, e, c], {"RUNNING"}, timeout_s, [])
    at(w, c, 2, timeout_s)
    one = w.store.group(1)
    assert one is not None and sorted(one.plan.job_ids) == sorted((a, e, c)), one
    pins = {m.job_id: m.rollout_pins for m in one.plan.members}
    assert pins[a] == pins[e] != pins[c], pins
    held = allocplan.held_nodes(w.store.allocs(1, live_only=False))
    e_node, c_node = held[pins[e][0]][1], held[pins[c][0]][1]
    then = GroupPlan(one.plan.rollout_nodes, 1, tuple(
        MemberPlan(m.job_id, pins[c] if m.job_id == e else m.rollout_pins, m.turns)
        for m in one.plan.members if m.job_id != c))
    new = w.store.next_group_id()
    w.store.commit_moves(
        [(1, one.label, replace(one.plan, then=then), False),
         (new, label(new), GroupPlan(1, 1, (MemberPlan(c, (0,)),)), True)],
        [(c, 1, new, f"moving from group 1 to group {new}: a test re-plan")], time.time())
    kept = w.store.group(1)
    assert kept is not None and kept.plan.job_ids == one.plan.job_ids   # as it runs
    settle(lambda: row(w, c), timeout_s, interval_s=0.1,
           until=lambda r: r.moving_from is None)
    assert row(w, c).reason == f"moved from group 1 to group {new} by a re-plan"
    taken = w.store.group(1)
    assert taken is not None and taken.plan.then is None
    assert {m.job_id: m.rollout_pins for m in taken.plan.members} == {a: pins[a],
                                                                     e: pins[c]}
    return Repinned(a, e, c, new, e_node, c_node)
