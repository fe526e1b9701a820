"""Room for jobs that wait (daemon/room.py): which pools may be narrowed to admit them,
to what width, and over how many nodes a new pool stripes its first row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from weave_slurm.daemon import room
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow, MemberPlan
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity, ClusterState, Member
from weave_slurm.placement.pooled import pooled_group

#: Two rollout nodes of 8 GPUs, as README's cluster.
CAP = replace(Capacity(4, 8, 1000.0, 1000.0, 2, 2, CostRates(1.0, 2.85)),
              rollout_pooled=True, rollout_gpus_per_node=8)
JOB = simple_profile("1", 100.0, 40.0, 2.0)


def _row(key: int, group: int, nodes: Sequence[str], gpus: int,
         state: AllocState = AllocState.HELD, gone: tuple[str, ...] = ()) -> AllocRow:
    return AllocRow(key, group, "rollout", f"h20-{key}", "h20", len(nodes) or 1, gpus, "h20",
                    1, state, str(100 + key) if nodes else None, tuple(nodes), "", gone=gone)


def _pool(pins: tuple[int, ...], gpus: int, job: int = 1) -> GroupPlan:
    return GroupPlan(len(pins), 1, (MemberPlan(job, pins),), rollout_gpus=gpus)


def _job(job_id: int, group: int, state: JobState = JobState.RUNNING,
         moving_from: int | None = None) -> JobRow:
    return JobRow(job_id, 0, "root", f"j{job_id}", None, "", "", JOB.with_id(str(job_id)),
                  state, "", group, 0.0, 1.0, None, moving_from=moving_from)


def test_a_new_pool_stripes_over_the_nodes_left_wholly_free() -> None:
    both = {1: [_row(1, 1, ["h20-0", "h20-1"], 8)]}
    # the pool keeps one node (its row's first) and gives the other back
    assert room.stripe(CAP, 8, {1: _pool((0,), 8)}, both) == 1
    assert room.stripe(CAP, 12, {1: _pool((0,), 8)}, both) == 2   # 12 fits on no one node
    assert room.stripe(CAP, 8, {1: _pool((0, 1), 8)}, both) == 2   # none free: shares
    # a pinned group's whole node, and a row not granted yet (its node not known)
    pinned = GroupPlan(1, 1, (MemberPlan(1, (0,)),))
    assert room.stripe(CAP, 8, {1: pinned}, {1: [_row(1, 1, ["h20-1"], 8)]}) == 1
    wanted = {1: [_row(1, 1, [], 8, AllocState.WANTED)]}
    assert room.used_nodes({1: pinned}, wanted) == (set(), 1)
    assert room.stripe(CAP, 8, {1: pinned}, wanted) == 1
    # a group being released (no plan here) keeps every node of its rows
    assert room.used_nodes({}, both) == ({"h20-0", "h20-1"}, 0)
    assert room.stripe(CAP, 8, {}, both) == 2


def _wide() -> tuple[ClusterState, list[GroupRow], list[JobRow], dict[int, list[AllocRow]]]:
    group = pooled_group(1, (Member(JOB.with_id("1"), (0,)),), 16, 8)
    state = ClusterState(CAP, (group,), 2)
    rows = [GroupRow(1, "1", GroupState.ACTIVE, _pool((0, 1), 8), 0.0, "")]
    return state, rows, [_job(1, 1)], {1: [_row(1, 1, ["h20-0", "h20-1"], 8)]}


def test_a_pool_is_narrowed_to_the_whole_nodes_it_keeps() -> None:
    state, groups, jobs, allocs = _wide()
    (pool,) = room.candidates(state, groups, jobs, allocs)
    assert pool.pool_gpus == 8   # one node of 8: Slurm shrinks by nodes
    (narrower,) = room.narrowings(state, [pool])
    assert narrower.rollout_nodes_used == 1 and state.rollout_nodes_used == 2


def test_no_pool_is_narrowed_while_it_changes() -> None:
    state, groups, jobs, allocs = _wide()
    moving = [_job(1, 1, moving_from=3)]
    assert not room.candidates(state, groups, moving, allocs)
    placed = [_job(1, 1, JobState.PLACED)]
    assert not room.candidates(state, groups, placed, allocs)
    shrinking = {1: [_row(1, 1, ["h20-0", "h20-1"], 8, gone=("h20-1",))]}
    assert not room.candidates(state, groups, jobs, shrinking)
    asking = {1: [_row(1, 1, [], 8, AllocState.ALLOCATING)]}
    assert not room.candidates(state, groups, jobs, asking)
    draining = [replace(groups[0], state=GroupState.DRAINING)]
    assert not room.candidates(state, draining, jobs, allocs)
    closed = replace(state, closed=frozenset({1}))
    assert not room.candidates(closed, groups, jobs, allocs)
