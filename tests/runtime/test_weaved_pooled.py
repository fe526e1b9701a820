"""Pooled groups through weaved, on the LocalBackend with real node daemons (the site's
``[limits] rollout = "pooled"``, daemon/pooling.py): three poolable jobs are placed in
one pooled group, which holds GPU shares of rollout nodes rather than the nodes; each
member's rollout runs as one engine per GPU of the pool, over all of it. A fourth
arrives mid-run and the pool changes its width: a new share beside the old one, the
members re-pinned onto it at their phase boundaries, the old share returned once no
one runs on it. Each job ends with its solo run's weights (a one-engine run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import weaved
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import wait_for
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon import pooling
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import GroupPlan
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytestmark = pytest.mark.torch

STEPS = 8
POOLED = {**OPTIONS, "sampling": "per_prompt"}
SITE = """
[pools.rollout]
[pools.train]
[limits]
rollout = "pooled"
[runtime]
gangs = true
plan_from_measurements = false
"""


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with weaved.rl_site("weaved-pool-", SITE) as config:
        yield config


def _submit(sock: object, k: int, seed: int, rollout_s: float = 60.0) -> int:
    spec = job_spec_toml(f"p{k}", iterations=STEPS, seed=seed, options=POOLED,
                         rollout_s=rollout_s, train_s=10.0, slo=2.0)
    return int(weaved.call(sock, Op.SUBMIT, spec=spec, source=f"p{k}.toml")["job"])


def test_a_pool_of_three_widens_for_a_fourth_and_each_ends_as_solo(cfg: DaemonConfig) -> None:
    served = weaved.serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        seeds = {_submit(sock, k, 81 + k): 81 + k for k in range(3)}
        first = list(seeds)
        wait_for(lambda: [w.driver.live(j) for j in first], 180, "three jobs at version 1",
                 interval_s=0.2, until=lambda rows: all(
                     r is not None and r["version"] >= 1 for r in rows))
        (group,) = w.store.groups()
        before: GroupPlan = group.plan
        assert before.rollout_gpus is not None and set(before.job_ids) == set(first), before
        assert all(m.rollout_pins == before.members[0].rollout_pins for m in before.members)
        job = _submit(sock, 3, 84, rollout_s=480.0)   # a long rollout: a wider pool
        seeds[job] = 84
        wait_for(lambda: w.driver.live(job), 180, f"job {job} at version 1", interval_s=0.2,
                 until=lambda r: r is not None and r["version"] >= 1)
        (group,) = w.store.groups()
        allocs = w.store.allocs(group.group_id, live_only=False)
        after = group.plan
        assert job in after.job_ids and len(after.members) == 4, after
        assert pooling.width(after, allocs) > pooling.width(before, allocs), (before, after)
        rows = weaved.wait_states(sock, list(seeds), {"COMPLETED", "FAILED"}, 300, [])
        assert [r["state"] for r in rows] == ["COMPLETED"] * 4, rows
        allocs = w.store.allocs(group.group_id, live_only=False)
        shares = [a for a in allocs if a.role == "rollout"]
        print([(a.key, a.gpus_per_node, a.nodes, a.state.value) for a in shares])
        assert all(a.gpus_per_node < 8 for a in shares), shares   # shares, not nodes
        assert len(shares) >= 2, shares   # the first share and the one the fourth added
        for j, seed in seeds.items():
            solo = run_solo(MemberSpec(str(j), seed=seed, steps=STEPS, options=POOLED))
            live = w.driver.live(j)
            assert live is not None and live["weights_sha256"] == weights_digest(solo.weights)
    finally:
        weaved.stop_released(served)
