"""weave-live's pools (sim/live_pools.py): each pool held as weaved holds it, rows of
GPU shares kept until wholly spare, and the group charged for what it holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Member
from weave_slurm.placement.pooled import pooled_group, widens
from weave_slurm.sim.live_pools import HeldPool, LivePools, held_pool, planned

CAP = replace(Capacity(4, 8, 1000.0, 1000.0, 16, 16, CostRates(1.0, 3.0)),
              rollout_pooled=True, rollout_gpus_per_node=8)


@pytest.mark.parametrize(("before", "width", "step", "rows"), [
    ((), 12, 1, ((2, 6),)),                 # a new pool: one row on the fewest nodes
    ((), 9, 1, ((2, 5),)),                  # ... rounded up to equal shares: 10 GPUs
    ((), 6, 4, ((1, 8),)),                  # ... and to whole engines: 8 GPUs
    (((2, 5),), 14, 1, ((2, 5), (2, 2))),   # wider: keeps its row, asks one as spread
    (((1, 4),), 7, 1, ((1, 4), (1, 3))),
    (((2, 5), (2, 2)), 10, 1, ((2, 5),)),   # narrower: the newest row, wholly spare
    (((2, 5), (2, 2)), 11, 1, ((2, 5), (2, 2))),   # ... not spare: both kept (14)
    (((2, 6),), 4, 1, ((2, 6),)),           # a single row it cannot split: kept whole
    (((1, 3),), 8, 2, ((1, 8),)),           # a share no newcomer's engine fits: a new row
])
def test_a_pool_holds_rows_of_shares_as_weaved_does(
        before: tuple[tuple[int, int], ...], width: int, step: int,
        rows: tuple[tuple[int, int], ...]) -> None:
    held = held_pool(HeldPool(before) if before else None, width, 8, step)
    assert held.rows == rows
    assert held.gpus >= width


def _group(width: int, *names: str):  # type: ignore[no-untyped-def]
    jobs = [simple_profile(n, 100.0, 60.0, 2.0) for n in names]
    return pooled_group(1, tuple(Member(j, (0,)) for j in jobs), width, 8)


def test_a_pool_is_charged_for_the_gpus_it_holds_not_its_width() -> None:
    pools, empty = LivePools(), ClusterState(CAP, next_group_id=1)
    first = pools.hold(empty, ClusterState(CAP, (_group(9, "a", "b"),), 2))
    (g,) = first.groups
    assert g.pool_gpus == 10   # striped (up to 8 nodes): five shares of 2 GPUs
    assert pools.held[1].rows == ((5, 2),)
    assert first.cost_per_hour == pytest.approx(10 / 8 * 1.0 + 3.0)
    # b leaves and placement narrows the pool to 6 GPUs: its one row is kept whole
    narrow = ClusterState(CAP, (_group(6, "a"),), 2)
    after = pools.hold(first, narrow)
    assert after.groups[0].pool_gpus == 10
    # a member whose pool holds what it held is not re-pinned; the caller's pause goes
    assert pools.recharged(first, after, {"a": 30.0}) == {}
    # a pool that takes a row re-pins its members
    wide = pools.hold(after, ClusterState(CAP, (_group(15, "a", "c"),), 2))
    assert wide.groups[0].pool_gpus == 15   # (5 x 2) + (5 x 1): as many nodes again
    assert set(pools.recharged(after, wide, {})) == {"a"}
    # a group placement left alone is left as held; a group gone drops its rows
    assert pools.hold(wide, wide) is wide
    pools.hold(wide, ClusterState(CAP, (), 2))
    assert pools.held == {}


def test_a_job_not_taken_as_width_free_is_never_pooled() -> None:
    p = replace(simple_profile("a", 100.0, 60.0, 2.0), rollout_floor_s=20.0)
    assert widens(planned(p, True))
    assert not widens(planned(p, False))
