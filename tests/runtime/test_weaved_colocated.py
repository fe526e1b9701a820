"""A co-located job through weaved across a weaved restart, on the LocalBackend with
real node daemons (the site's ``[limits] colocation = true``): placed co-located, its
group holds one training allocation and no rollout allocation; weaved is stopped
mid-run and started again on its state dir; the fresh weaved rebuilds the group's
runtime with no rollout node, re-attaches the member to its warm state on its training
node, and it ends with its solo weights, its rollouts on that node throughout. And
its training allocation ending under weaved: the group re-formed on a new training
allocation alone, the member carried there from its checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import weaved
from tests.harness.processes import daemons_gone
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch

#: Enough iterations that rollouts are left for the fresh weaved to run.
STEPS = 12
SITE = """
[pools.rollout]
[pools.train]
[limits]
colocation = true
[runtime]
plan_from_measurements = false
"""


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with weaved.rl_site("weaved-co-", SITE) as config:
        yield config


def _running(served: weaved.Served, sock: Path, version: int) -> tuple[int, dict[str, Any]]:
    """The reference job submitted, once at ``version``: its id and its (only) group.
    Its declared co-located iteration (12 s) beats any group of jobs like it."""
    spec = job_spec_toml("colo", iterations=STEPS, seed=61, options=OPTIONS).replace(
        "[profile]\n", "[profile]\ncolo_iter_s = 12.0\n", 1)
    job = int(weaved.call(sock, Op.SUBMIT, spec=spec, source="colo.toml")["job"])
    live = served.weaved.driver.live
    wait_for(lambda: live(job), 120, f"job {job} at version {version}", interval_s=0.1,
             until=lambda at: at is not None and at["version"] >= version)
    (group,) = weaved.call(sock, Op.GROUPS)["groups"]
    return job, group


def _ended_as_solo(served: weaved.Served, sock: Path, job: int) -> None:
    """It COMPLETED, re-admitted at least once, with its solo run's weights."""
    rows = weaved.wait_states(sock, [job], {"COMPLETED", "FAILED"}, 240, [])
    assert rows[0]["state"] == "COMPLETED", rows
    live = served.weaved.driver.live(job)
    assert live is not None and live["recoveries"] >= 1, live   # re-admitted, not afresh
    solo = run_solo(MemberSpec(str(job), seed=61, steps=STEPS, options=OPTIONS))
    assert live["weights_sha256"] == weights_digest(solo.weights)


def test_a_colocated_job_is_re_attached_after_a_weaved_restart(cfg: DaemonConfig) -> None:
    served = weaved.serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        job, group = _running(served, sock, 1)
        assert [(a["role"], a["nodes"]) for a in group["allocations"]] == \
            [("train", ["h800-0"])], group
        served.stop()
        at = w.driver.live(job)
        assert at is not None and at["version"] < STEPS, at   # rollouts are left
        served = weaved.serve(cfg)   # a fresh weaved on the same state dir
        w = served.weaved
        _ended_as_solo(served, sock, job)
        spans = w.driver.spans[group["group"]]  # type: ignore[attr-defined]
        assert {s.node for s in spans if s.kind is Phase.ROLLOUT} == {"h800-0"}
        settle(lambda: not w.backend.list_allocations(""), 30, interval_s=0.3)
        assert not w.backend.list_allocations("")
        assert daemons_gone(w.config.state_dir.resolve() / "ckpt", 30)
    finally:
        weaved.stop_released(served)


def test_a_colocated_job_whose_training_allocation_vanished_goes_on_from_its_checkpoint(
        cfg: DaemonConfig) -> None:
    """Its only allocation ends under weaved (as Slurm ends a job whose node went DOWN):
    the group is re-formed on a new training allocation, still with no rollout node, and
    the member is carried there from its last checkpoint; it ends with its solo weights."""
    served = weaved.serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        job, group = _running(served, sock, 2)
        (alloc,) = group["allocations"]
        w.backend.release(str(alloc["id"]))     # gone from the backend, not by weaved

        def replaced() -> list[dict[str, object]] | None:
            groups = weaved.call(sock, Op.GROUPS)["groups"]
            new = [a for g in groups for a in g["allocations"]
                   if a["state"] == "HELD" and a["id"] != alloc["id"]]
            return new or None
        new = wait_for(replaced, 120, "a new allocation for the group", interval_s=0.2)
        assert new is not None and [a["role"] for a in new] == ["train"], new   # no rollout node
        _ended_as_solo(served, sock, job)
        spans = w.driver.spans[group["group"]]  # type: ignore[attr-defined]
        assert {s.node for s in spans if s.kind is Phase.ROLLOUT} <= {"h800-0", "h800-1"}
    finally:
        weaved.stop_released(served)
