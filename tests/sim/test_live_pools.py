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
from weave_slurm.placement.pooled import pooled_group, shrunk_rows, widens
from weave_slurm.sim.ledger import Ledger
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
    (((2, 5), (2, 2)), 11, 1, ((2, 5), (1, 2))),   # ... in part: a node of it given back
    (((2, 6),), 4, 1, ((1, 6),)),           # a single row: its spare node given back
    (((1, 6),), 4, 1, ((1, 6),)),           # ... but not its first: kept whole
    (((1, 3),), 8, 2, ((1, 8),)),           # a share no newcomer's engine fits: a new row
])
def test_a_pool_holds_rows_of_shares_as_weaved_does(
        before: tuple[tuple[int, int], ...], width: int, step: int,
        rows: tuple[tuple[int, int], ...]) -> None:
    held, replaced = held_pool(HeldPool(before) if before else None, width, 8, step)
    assert held.rows == rows and replaced == 0
    assert held.gpus >= width


@pytest.mark.parametrize(("before", "width", "rows"), [
    (((5, 2),), 6, ((3, 2),)),              # a striped row gives back single nodes
    (((5, 2),), 5, ((3, 2),)),              # ... down to what still holds the width
    (((2, 6),), 4, ((1, 6),)),              # ... keeping one node of each row
    (((2, 5), (2, 2)), 11, ((2, 5), (1, 2))),   # the newest row first
    (((2, 5), (2, 2)), 7, ((2, 5),)),       # a wholly spare row goes whole
    (((2, 5),), 14, ((2, 5), (2, 2))),      # wider: as without shrinking
])
def test_a_pool_that_may_shrink_rows_gives_back_their_spare_nodes(
        before: tuple[tuple[int, int], ...], width: int,
        rows: tuple[tuple[int, int], ...]) -> None:
    held, replaced = held_pool(HeldPool(before), width, 8, 1, shrink_nodes=True)
    assert held.rows == rows and replaced == 0
    assert held.gpus >= width
    assert shrunk_rows(before, 10**6) == before          # nothing spare: unchanged


#: A site whose groups span one rollout node: new pools are not striped.
ONE_NODE = replace(CAP, max_rollout_nodes_per_group=1)


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
    # b leaves and placement narrows the pool to 6 GPUs: two nodes of its row go back
    narrow = ClusterState(CAP, (_group(6, "a"),), 2)
    after = pools.hold(first, narrow)
    assert after.groups[0].pool_gpus == 6 and pools.held[1].rows == ((3, 2),)
    assert set(pools.recharged(first, after, {"a": 30.0})) == {"a"}   # re-pinned
    # a member whose pool holds what it held is not re-pinned; the caller's pause goes
    same = pools.hold(after, ClusterState(CAP, (_group(6, "a"),), 2))
    assert pools.recharged(after, same, {"a": 30.0}) == {}
    # a pool that takes a row re-pins its members
    wide = pools.hold(same, ClusterState(CAP, (_group(15, "a", "c"),), 2))
    assert wide.groups[0].pool_gpus == 15   # (3 x 2) + (3 x 3): as many nodes again
    assert set(pools.recharged(same, wide, {})) == {"a"}
    # a group placement left alone is left as held; a group gone drops its rows
    assert pools.hold(wide, wide) is wide
    pools.hold(wide, ClusterState(CAP, (), 2))
    assert pools.held == {}


def test_a_job_not_taken_as_width_free_is_never_pooled() -> None:
    p = replace(simple_profile("a", 100.0, 60.0, 2.0), rollout_floor_s=20.0)
    assert widens(planned(p, True))
    assert not widens(planned(p, False))


def _pair(width: int):  # type: ignore[no-untyped-def]
    """Two members whose training binds the period (tests/placement/test_pooled_shrink)."""
    jobs = [simple_profile(n, 100.0, 600.0, 3.0) for n in "ab"]
    return pooled_group(1, tuple(Member(j, (0,)) for j in jobs), width, 8)


def test_a_pool_replaces_its_row_where_that_pays_and_books_the_overlap() -> None:
    """1 x 4 GPUs narrowed to 2: over the members' remaining hour the replacement pays
    (placement.pool_shrink): the pool holds 1 x 2, its members are re-pinned, and the
    replaced 4 GPUs stay held one period and a re-pin longer (booked by the replay).
    Pools of one node each (no stripe), the rule of rows alone (weaved before it shrank
    rows by nodes: a narrower pool now replaces no row)."""
    empty = ClusterState(ONE_NODE, next_group_id=1)
    for remaining, replace_rows, gpus, overlap in (
            ({"a": 3600.0, "b": 3600.0}, True, 2, 4 * 1202.0),
            ({"a": 1800.0, "b": 3600.0}, True, 4, 0.0),   # half an hour: does not pay
            ({"a": 3600.0, "b": 3600.0}, False, 4, 0.0)):   # whole rows only
        pools = LivePools(replace_rows, shrink_nodes=False)
        first = pools.hold(empty, ClusterState(ONE_NODE, (_pair(4),), 2), remaining)
        assert pools.held[1] == HeldPool(((1, 4),)) and pools.overlap_gpu_s == 0
        after = pools.hold(first, ClusterState(ONE_NODE, (_pair(2),), 2), remaining)
        assert after.groups[0].pool_gpus == gpus
        assert pools.overlap_gpu_s == pytest.approx(overlap)
        repinned = set(pools.recharged(first, after, {}))
        assert repinned == ({"a", "b"} if gpus == 2 else set())


def test_the_replays_books_charge_rows_held_beside_a_new_one() -> None:
    books = Ledger(0.0)
    books.held_longer(0.5 * 3600, CostRates(1.0, 3.0))   # half a node for an hour
    assert books.cost == pytest.approx(0.5)
    assert books.node_s["rollout"] == pytest.approx(1800.0)
    assert books.busy_s["rollout"] == 0.0   # idle: nobody runs on them


def test_a_whole_node_row_is_replaced_only_where_the_pools_free_gpus_hold_the_new_one() -> None:
    """1 x 8 GPUs narrowed to 2: nothing fits beside the row; the rollout pool's free
    GPUs (16 nodes of 8, 8 of them held) hold the new row of 2, unless the replay counts
    only the GPUs beside the rows (``beside_only``)."""
    empty, hour = ClusterState(ONE_NODE, next_group_id=1), {"a": 3600.0, "b": 3600.0}
    for beside_only, gpus in ((False, 2), (True, 8)):
        pools = LivePools(beside_only=beside_only, shrink_nodes=False)
        first = pools.hold(empty, ClusterState(ONE_NODE, (_pair(8),), 2), hour)
        assert pools.held[1] == HeldPool(((1, 8),))
        after = pools.hold(first, ClusterState(ONE_NODE, (_pair(2),), 2), hour)
        assert after.groups[0].pool_gpus == gpus
        assert pools.overlap_gpu_s == pytest.approx(8 * 1202.0 if gpus == 2 else 0.0)
