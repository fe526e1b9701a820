"""Rollout scaling and shrinking through weaved, on the LocalBackend with real node
daemons: a job that cannot share the running job's rollout node (its declared rollout
state and the other's do not fit one node's host memory) while their training fits the
training node is admitted by scaling the group's rollout nodes. weaved holds one more
allocation, the running group's runtime grows onto it, the scaled-in job runs there
and ends with its solo weights while the other never stops; once it has left, the
group returns the extra allocation and the other still ends with its solo weights.
The same holds when weaved is stopped and started again on its state dir mid-run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import daemons_gone
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import (
    Served,
    call,
    release_all,
    rl_config,
    serve,
    smoke_site,
    wait_states,
)
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.states import AllocState
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch

#: Declared rollout state per node: two such jobs never share a rollout node (the
#: default site's nodes have 2048 GiB), one fits; their training shares the h800 node.
BIG_GIB = 1500.0
LONG, SHORT = 120, 3   # iterations: the first job outlives the scaled-in one
#: The scaled-in job across a restart: enough iterations that rollouts are left for the
#: fresh weaved to run (3 may all be done by the time the first one has stopped).
ACROSS = 12


def _submit(sock: Path, name: str, seed: int, iterations: int) -> int:
    spec = job_spec_toml(name, iterations=iterations, seed=seed, options=OPTIONS,
                         rollout_state_gib=BIG_GIB)
    return int(call(sock, Op.SUBMIT, spec=spec, source=f"{name}.toml")["job"])


#: The default site's pools, planning with the declared profiles only: once the first
#: job has 3 samples per phase its measured profile (megabytes of state, a budget of a
#: fraction of a second) would otherwise decide where the second goes, and whether it
#: has them by then is a race with the reconcile tick.
SITE = """
[pools.rollout]
[pools.train]
[runtime]
plan_from_measurements = false
"""


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with public_dir("weaved-sc-") as public, shm_dir("weaved-sc-") as shm:
        (public / "site.toml").write_text(smoke_site(SITE))
        yield rl_config(public, shm, site_path=public / "site.toml")


def _live(w: Weaved, job: int, what: str, until: Any, timeout_s: float = 180) -> Any:
    return wait_for(lambda: w.driver.live(job), timeout_s, f"job {job}: {what}",
                    interval_s=0.1, until=lambda live: live is not None and until(live))


def _scale_in(w: Weaved, sock: Path, b_iterations: int = SHORT) -> tuple[int, int]:
    """Job a running; b submitted and admitted by rollout scaling into a's group."""
    a = _submit(sock, "first", 51, LONG)
    _live(w, a, "at version 1", lambda live: live["version"] >= 1)
    row = w.store.job(a)
    assert row is not None and row.measured is None   # placement plans with 1500 GiB
    b = _submit(sock, "scaled", 52, b_iterations)
    wait_states(sock, [b], {"RUNNING", "FAILED"}, 120, [])
    assert [t.reason for t in w.store.transitions("job", b)][1] \
        == "scale_rollout into group 1"
    rows = w.store.allocs(1, live_only=False)
    assert [(r.role, r.pool, r.state) for r in rows] == [
        ("rollout", "h20-0", AllocState.HELD), ("train", "h800-0", AllocState.HELD),
        ("rollout", "h20-1", AllocState.HELD)]
    return a, b


def _rollout_nodes(w: Weaved, job: int) -> set[str]:
    spans = getattr(w.driver, "spans", {}).get(1, [])
    return {s.node for s in spans if s.job_id == str(job) and s.kind is Phase.ROLLOUT and s.ok}


def _matches_solo(w: Weaved, job: int, seed: int, iterations: int) -> None:
    live = w.driver.live(job)
    assert live is not None and live["version"] == iterations
    solo = run_solo(MemberSpec(str(job), seed=seed, steps=iterations, options=OPTIONS))
    assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"


def _shrinks(w: Weaved, sock: Path, a: int) -> None:
    """The scaled-in job has left: the group returns its allocation, a runs on."""
    rows = settle(lambda: w.store.allocs(1, live_only=False), 60, interval_s=0.2,
                  until=lambda rows: rows[2].state is AllocState.RELEASED)
    assert [r.state for r in rows] == [AllocState.HELD, AllocState.HELD, AllocState.RELEASED]
    assert "no member of group 1 is pinned to its node(s) h20-1" in \
        w.store.transitions("alloc", rows[2].key)[-2].reason
    assert call(sock, Op.STATUS, jobs=[a])["jobs"][0]["state"] == "RUNNING"
    assert sorted(x.nodes[0] for x in w.backend.list_allocations("")) == ["h20-0", "h800-0"]


def _both_complete(w: Weaved, sock: Path, a: int, b: int, b_iterations: int = SHORT) -> None:
    """The scaled-in job ``b`` completes on the added node with its solo weights; the
    group shrinks; ``a`` completes on the first node with its solo weights."""
    rows = wait_states(sock, [b], {"COMPLETED", "FAILED"}, 180, [])
    assert rows[0]["state"] == "COMPLETED", rows
    _matches_solo(w, b, 52, b_iterations)
    assert _rollout_nodes(w, b) == {"h20-1"}
    _shrinks(w, sock, a)
    rows = wait_states(sock, [a], {"COMPLETED", "FAILED"}, 240, [])
    assert rows[0]["state"] == "COMPLETED", rows
    _matches_solo(w, a, 51, LONG)


def _drained(w: Weaved, shm: Path, ids: list[int]) -> None:
    settle(lambda: not w.backend.list_allocations(""), 30, interval_s=0.3)
    assert not w.backend.list_allocations("")
    assert [p for p in shm.rglob("*") if p.name in {str(j) for j in ids}] == []
    assert daemons_gone(w.config.state_dir.resolve() / "ckpt", 30)


def test_a_scaled_in_job_runs_on_the_added_node_then_the_group_shrinks(
        cfg: DaemonConfig) -> None:
    served = serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        a, b = _scale_in(w, sock)
        _both_complete(w, sock, a, b)
        assert _rollout_nodes(w, a) == {"h20-0"}
        live = w.driver.live(a)
        assert live is not None and live["recoveries"] == 0   # never stopped
        row = w.store.job(a)   # 120 iterations measured, none fed back (the site's choice)
        assert row is not None and row.measured is None
        _drained(w, cfg.shm_root, [a, b])
    finally:
        _stop(served)


def test_scaling_holds_across_a_weaved_restart(cfg: DaemonConfig) -> None:
    served = serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        a, b = _scale_in(w, sock, ACROSS)
        _live(w, b, "at version 1 on the added node", lambda live: live["version"] >= 1)
        served.stop()
        assert not served.thread.is_alive()
        at = w.driver.live(b)
        assert at is not None and at["version"] < ACROSS, at   # rollouts are left
        served = serve(cfg)   # a fresh weaved on the same state dir
        w = served.weaved
        _both_complete(w, sock, a, b, ACROSS)
        for job in (a, b):   # re-attached to their warm state, not started afresh
            live = w.driver.live(job)
            assert live is not None and live["recoveries"] >= 1
        _drained(w, cfg.shm_root, [a, b])
    finally:
        _stop(served)


def _stop(served: Served) -> None:
    served.stop()
    release_all(served.weaved.backend)
