"""A pool's rows replaced by one smaller row (placement/pooled.py ``pool_rows`` with
``pays``; placement/pool_shrink.py ``shrink_pays``): only where the new row fits beside
the rows it replaces, and only where the freed GPUs pay the re-pins and the overlap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.pool_shrink import (
    free_gpus,
    overlap_s,
    pool_horizon,
    shrink_books,
    shrink_pays,
)
from weave_slurm.placement.pooled import RowShrink, pool_rows, pooled_group
from weave_slurm.placement.replan import DEFAULT_HORIZON_S, MAX_HORIZON_S

CAP = replace(Capacity(4, 8, 1000.0, 1000.0, 16, 16, CostRates(1.0, 3.0)),
              rollout_pooled=True, rollout_gpus_per_node=8)


def _always(s: RowShrink) -> bool:
    return True


def _never(s: RowShrink) -> bool:
    return False


@pytest.mark.parametrize(("rows", "width", "step", "want"), [
    (((1, 4),), 2, 1, ((False,), (1, 2))),    # 2 GPUs beside the 4 it gives back
    (((1, 6),), 2, 2, ((False,), (1, 2))),    # ... in whole engines
    (((2, 5), (2, 2)), 11, 1, ((True, False), (1, 1))),   # the newest row replaced
    (((2, 5),), 6, 1, ((False,), (2, 3))),    # 3 of each of its nodes beside the 5
    (((1, 8),), 4, 1, ((True,), None)),       # a whole node: no room beside it, kept
    (((1, 5),), 4, 1, ((True,), None)),       # 4 do not fit beside 5 on a node of 8
    (((2, 4),), 2, 1, ((False,), (2, 1))),    # spread over the nodes it replaces
    (((2, 5), (2, 2)), 10, 1, ((True, False), None)),   # a whole row spare: returned
])
def test_a_pool_replaces_rows_by_one_that_fits_beside_them(
        rows: tuple[tuple[int, int], ...], width: int, step: int,
        want: tuple[tuple[bool, ...], tuple[int, int] | None]) -> None:
    assert pool_rows(rows, width, 8, step, _always) == want
    keep, new = pool_rows(rows, width, 8, step, _never)   # never: whole rows only
    assert (keep, new) == pool_rows(rows, width, 8, step)
    held = sum(n * g for (n, g), on in zip(rows, want[0], strict=True) if on)
    assert held + (want[1][0] * want[1][1] if want[1] else 0) >= width


@pytest.mark.parametrize(("rows", "width", "free", "want"), [
    (((1, 8),), 4, 4, ((False,), (1, 4))),    # a whole node: the new row elsewhere
    (((1, 8),), 4, 3, ((True,), None)),       # ... only where the pool's free GPUs hold it
    (((2, 7),), 10, 10, ((False,), (2, 5))),  # 5 do not fit beside 7: 2 x 5 elsewhere
    (((2, 7),), 10, 9, ((True,), None)),
    (((1, 4),), 2, 0, ((False,), (1, 2))),    # beside the old row: no free GPUs needed
])
def test_a_new_row_that_does_not_fit_beside_counts_on_the_pools_free_gpus(
        rows: tuple[tuple[int, int], ...], width: int, free: int,
        want: tuple[tuple[bool, ...], tuple[int, int] | None]) -> None:
    assert pool_rows(rows, width, 8, 1, _always, free) == want


def test_free_gpus_are_the_rollout_pools_less_every_groups_old_and_new() -> None:
    """16 rollout nodes of 8 GPUs; a pinned group on 2 nodes and a pool of 12 GPUs
    narrowed to 6: its 12 are held until its members have moved."""
    job = simple_profile("p", 100.0, 60.0, 2.0)
    pinned = Group(2, (Member(job, (0, 1)),), 2, 1)
    before = ClusterState(CAP, (_pair(12), pinned), 3)
    after = ClusterState(CAP, (_pair(6), pinned), 3)
    assert free_gpus(before, after) == 128 - 16 - 12
    assert free_gpus(after, after) == 128 - 16 - 6
    assert free_gpus(before, ClusterState(CAP, (pinned,), 3)) == 128 - 16 - 12


def test_the_rule_is_asked_with_what_each_choice_holds() -> None:
    seen: list[RowShrink] = []

    def record(s: RowShrink) -> bool:
        seen.append(s)
        return False

    # 14 held; whole rows keep both. Candidates: keep (2 x 5), replace (2 x 2) by
    # (1 x 1): 11 GPUs; replace both by (4 x 3): 12 GPUs
    assert pool_rows(((2, 5), (2, 2)), 11, 8, 1, record) == ((True, True), None)
    assert sorted(seen, key=lambda s: s.shrunk) == [
        RowShrink(was=14, kept=14, shrunk=11, new_row=1, replaced=4),
        RowShrink(was=14, kept=14, shrunk=12, new_row=12, replaced=14)]


def _pair(width: int) -> Group:
    """Two members whose training (600 s each, in turn) binds the period from 2 GPUs
    up: a narrower pool delivers the same work for less."""
    jobs = [simple_profile(n, 100.0, 600.0, 3.0) for n in "ab"]
    return pooled_group(1, tuple(Member(j, (0,)) for j in jobs), width, 8)


def test_a_replacement_pays_when_the_freed_gpus_beat_the_overlap_over_the_horizon() -> None:
    """1 x 4 GPUs -> 1 x 2: 2 GPUs freed at 1/8 per hour each (0.25 per hour); the 4
    replaced GPUs stay held one period (1,200 s) and the re-pin (2 s) longer: 4 x 1,202
    / 3,600 / 8 = 0.167, paid back in ~0.67 h. Over an hour it pays, over half an hour
    not (the period is the training's at both widths: the same work)."""
    group, s = _pair(2), RowShrink(was=4, kept=4, shrunk=2, new_row=2, replaced=4)
    assert replace(group, pool_gpus=4).schedule.expected_period_s == pytest.approx(1200.0)
    assert group.schedule.expected_period_s == pytest.approx(1200.0)
    assert overlap_s(group, CAP, 4) == pytest.approx(1202.0)
    b, charged = shrink_books(group, CAP, 3600.0, s)
    assert charged == {"a": 2.0, "b": 2.0}
    assert b.cost_before == pytest.approx(3.5)
    assert b.cost_after == pytest.approx(3.25 + 4 * 1202.0 / 3600 / 8)
    assert shrink_pays(group, CAP, 3600.0)(s)
    assert not shrink_pays(group, CAP, 1800.0)(s)
    rows = ((1, 4),)
    assert pool_rows(rows, 2, 8, 1, shrink_pays(group, CAP, 3600.0)) == ((False,), (1, 2))
    assert pool_rows(rows, 2, 8, 1, shrink_pays(group, CAP, 1800.0)) == ((True,), None)


def test_a_narrower_pool_that_lengthens_the_period_does_not_pay() -> None:
    """One member: its rollout is on its critical path, so 2 GPUs instead of 4 lengthen
    its period (1,000 s against 800 s): the work per hour falls more than the cost."""
    job = simple_profile("a", 100.0, 600.0, 2.0)
    group = pooled_group(1, (Member(job, (0,)),), 2, 8)
    s = RowShrink(was=4, kept=4, shrunk=2, new_row=2, replaced=4)
    assert not shrink_pays(group, CAP, MAX_HORIZON_S)(s)


def test_the_horizon_is_the_members_shortest_remaining_time() -> None:
    group = _pair(2)
    assert pool_horizon(group) == DEFAULT_HORIZON_S
    assert pool_horizon(group, {"a": 7200.0, "b": 5000.0}) == 5000.0
    assert pool_horizon(group, {"a": 7200.0}) == DEFAULT_HORIZON_S   # b's not known
    assert pool_horizon(group, {"a": 1e9, "b": 1e9}) == MAX_HORIZON_S
