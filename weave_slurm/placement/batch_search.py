"""After a batch's greedy: exact re-grouping of a few of the groups it formed (pure).

:func:`~weave_slurm.placement.admission.place_batch` places a batch one job at a time,
and a job placed early cannot see which later jobs it should have anchored a group
for: a short job with a tight budget, alone in its group, takes no long job (it would
have to take several turns beside it, and a join keeps the members' turns as they
are); a job that scales a group's rollout takes a node that two later jobs would have
shared. So after the greedy a local search takes sets of two or three of the groups
the batch itself formed, holding at most two groups' worth of jobs (``2 x
max_group_size``, and at most :data:`MAX_SOLVED_JOBS`), and groups those jobs again
exactly (:func:`~weave_slurm.placement.optimum.cheapest_grouping`: every partition,
pinning, turn set and cyclic order). Where that costs less per hour and fits the pools
it replaces them, and the search starts over, until no set improves (first
improvement, in a fixed order: deterministic).

Groups that hold a job placed before the batch are left as they are (moving a running
job is a charged re-plan, placement/replan.py), and so are pooled groups (a pool is
placed by its cost per unit of work, not per hour). A lower bound on a set's cost once
grouped again (its fewest groups at its smallest node shapes) skips, unsolved, every set
that cannot improve, and so does a set already solved without a gain; a batch examines
at most :data:`MAX_SETS` sets and spends at most :data:`MAX_WORK` on exact solves, so a
batch of thousands of jobs stays cheap (docs/placement.md, "Batches").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Admission, Decision, Placement
from weave_slurm.placement.group import Group
from weave_slurm.placement.optimum import cheapest_grouping

_EPS = 1e-9
#: Most sets of groups one batch examines (each an O(jobs) bound).
MAX_SETS = 4096
#: Most jobs one exact solve takes (it is exponential in them: 8 jobs in groups of up
#: to 5 take ~25 ms on the 2-core development machine, 6 in groups of 3 ~2 ms).
MAX_SOLVED_JOBS = 8
#: The exact solves one batch may spend, counted as 2**jobs each (the subsets the
#: dynamic programme visits): 64 solves of 6 jobs, 16 of 8.
MAX_WORK = 64 * 2**6


def improve_batch(before: ClusterState, after: ClusterState) -> ClusterState:
    """``after`` (``before`` with a batch placed) with the batch's own groups improved
    by the local search above; ``after`` itself when nothing improves."""
    cap = after.capacity
    fresh = [g for g in after.groups if g.group_id >= before.next_group_id
             and not g.pooled and (cap.colocation or not g.colocated)]
    if cap.max_group_size < 2 or len(fresh) < 2:
        return after
    groups, next_id = fresh, after.next_group_id
    used_r, used_t = after.rollout_nodes_used, after.train_nodes_used
    sets = work = 0
    tried: set[frozenset[str]] = set()   # job sets solved without a gain
    improved = True
    while improved:
        improved = False
        for combo in _sets(groups, min(2 * cap.max_group_size, MAX_SOLVED_JOBS)):
            sets += 1
            if sets > MAX_SETS:
                break
            jobs = [m.job for g in combo for m in g.members]
            current = sum(cap.rate_of(g) for g in combo)
            key = frozenset(j.job_id for j in jobs)
            if key in tried or current <= _cost_floor(jobs, cap) + _EPS:
                continue
            work += 2 ** len(jobs)
            if work > MAX_WORK:
                break
            best = cheapest_grouping(jobs, cap, pooled=False)
            if best is None or best.cost_per_hour >= current - _EPS:
                tried.add(key)
                continue
            d_r = sum(g.rollout_nodes for g in best.groups) - sum(g.rollout_nodes for g in combo)
            d_t = sum(g.train_nodes for g in best.groups) - sum(g.train_nodes for g in combo)
            if used_r + d_r > cap.rollout_pool_nodes + _EPS \
                    or used_t + d_t > cap.train_pool_nodes:   # the pools lack its nodes
                tried.add(key)
                continue
            ids = sorted(g.group_id for g in combo)
            while len(ids) < len(best.groups):
                ids.append(next_id)
                next_id += 1
            new = [replace(g, group_id=gid) for g, gid in zip(best.groups, ids, strict=False)]
            gone = {g.group_id for g in combo}
            groups = sorted([g for g in groups if g.group_id not in gone] + new,
                            key=lambda g: g.group_id)
            used_r, used_t = used_r + d_r, used_t + d_t
            improved = True
            break
    if groups is fresh:
        return after
    regrouped_ids = {g.group_id for g in fresh}
    kept = tuple(g for g in after.groups if g.group_id not in regrouped_ids)
    return replace(after, groups=(*kept, *groups), next_group_id=next_id)


def _sets(groups: Sequence[Group], most_jobs: int) -> Iterator[tuple[Group, ...]]:
    """Every pair, then every triple, of ``groups`` holding at most ``most_jobs`` jobs."""
    for size in (2, 3):
        for combo in itertools.combinations(groups, size):
            if sum(g.size for g in combo) <= most_jobs:
                yield combo


def _cost_floor(jobs: Sequence[JobProfile], cap: Capacity) -> float:
    """A lower bound on the cost per hour of ``jobs`` in any grouping: at least
    ``ceil(n / max_group_size)`` groups, each holding at least the smallest of the jobs'
    node counts in each pool (and some group the largest); where jobs may be co-located,
    a group may hold no rollout node and its co-located nodes."""
    n_groups = -(-len(jobs) // cap.max_group_size)
    if cap.colocation:
        train_least = min(min(j.train_nodes, j.colo_nodes or j.train_nodes) for j in jobs)
        return cap.rates.rate(0, n_groups * train_least)
    rollout = max(n_groups * min(j.rollout_nodes for j in jobs),
                  max(j.rollout_nodes for j in jobs))
    train = max(n_groups * min(j.train_nodes for j in jobs), max(j.train_nodes for j in jobs))
    return cap.rates.rate(rollout, train)


def decisions_in(state: ClusterState, greedy: ClusterState, decisions: Sequence[Decision],
                 order: Sequence[str]) -> tuple[Decision, ...]:
    """``decisions`` (the greedy's, which led to ``greedy``) with every placement naming
    the group its job is in in ``state`` (:func:`improve_batch` from ``greedy``).

    A job whose group the search changed is booked as if the group had been formed in
    ``order``: its first job a new group, each later one direct packing if it added no
    rollout node, else rollout scaling, with the nodes it added as its cost."""
    rank = {job_id: i for i, job_id in enumerate(order)}
    out: list[Decision] = []
    for d in decisions:
        if not isinstance(d, Placement):
            out.append(d)
            continue
        group = state.by_id[state.job_group[d.job_id]]
        if group is greedy.by_id.get(greedy.job_group[d.job_id]):   # not changed
            out.append(d)
            continue
        members = sorted(group.members, key=lambda m: rank.get(m.job.job_id, -1))
        mine = next(i for i, m in enumerate(members) if m.job.job_id == d.job_id)
        seen = {p for m in members[:mine] for p in m.rollout_pins}
        trained = max((m.job.train_nodes for m in members[:mine]), default=0)
        added_r = len(set(members[mine].rollout_pins) - seen)
        added_t = max(0, members[mine].job.train_nodes - trained)
        kind = Admission.NEW_GROUP if mine == 0 else (
            Admission.DIRECT if added_r == 0 else Admission.SCALE_ROLLOUT)
        rates = state.capacity.rates
        out.append(Placement(d.job_id, kind, group, rates.rate(added_r, added_t),
                             added_r, added_t))
    return tuple(out)
