"""Re-planning one group from scratch: which members share which rollout nodes.

Used by the exact optimum (every group it considers) and by placement, which may
re-pin a small group's members when a newcomer joins: a re-pin moves a member's warm
rollout state between two nodes of the same group over the fast intra-pool fabric.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cache, lru_cache

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.constraints import may_group
from weave_slurm.placement.group import (
    Group,
    Member,
    colocated_group,
    period_floor_s,
    turns_apart,
    turns_for,
)
from weave_slurm.placement.pooled import fewest_gpus, max_pool_gpus
from weave_slurm.placement.work import group_work_rate


def pinnings(needs: Sequence[int]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every way to pin members needing ``needs[i]`` rollout nodes each, up to renaming.

    Nodes are numbered in order of first use, so each layout appears once: member ``i``
    takes some nodes already used and the next unused ones. With one node per member
    these are exactly the set partitions of the members (Bell numbers); a member needing
    two nodes may share one with a member and the other with another.
    """
    def extend(i: int, used: int, acc: tuple[tuple[int, ...], ...]
               ) -> Iterator[tuple[tuple[int, ...], ...]]:
        if i == len(needs):
            yield acc
            return
        need = needs[i]
        for new in range(need + 1):
            for old in itertools.combinations(range(used), need - new):
                pins = (*old, *range(used, used + new))
                yield from extend(i + 1, used + new, (*acc, pins))

    yield from extend(0, 0, ())


@cache
def _pinnings_by_nodes(needs: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """All pinnings, fewest rollout nodes first."""
    return tuple(sorted(pinnings(needs), key=lambda ps: 1 + max(p for pins in ps for p in pins)))


def best_group(jobs: Sequence[JobProfile], cap: Capacity, group_id: int = 0,
               max_rollout_nodes: int | None = None, turns: bool = True,
               pooled: bool | None = None) -> Group | None:
    """The cheapest feasible configuration of one group holding exactly ``jobs``.

    Every pinning of the members onto rollout nodes, each of :func:`turn_sets` (one turn
    each without ``turns``) and every cyclic order up to rotation; pinnings are tried in
    order of rollout node count, so the first feasible one is the cheapest per hour, and
    of the feasible ones on that many nodes (the same cost per hour) the one whose
    members deliver the most work per hour wins (``work.group_work_rate``: the shortest
    period for the same turns; ties: the first found): the same job set on the same
    nodes then costs less per unit of work. ``max_rollout_nodes`` stops the search
    early. Memoised on (jobs, capacity, limit): re-plans ask for the same groups again
    and again. None when there is none, or when the jobs' charges differ or a solo job
    is among others (``constraints.may_group``). Where groups may pool their rollout GPUs
    (``pooled``; default: the capacity's), the pooled group on the fewest GPUs wins
    where it is cheaper per hour (placement/pooled.py); where jobs may be co-located
    (``Capacity.colocation``), a job alone co-located wins where that is cheaper per
    hour (placement/colocation.py).
    """
    if not may_group(jobs):   # one account and QOS, no solo job (placement/constraints.py)
        return None
    g = _best_group(tuple(jobs), cap, max_rollout_nodes, turns)
    if cap.rollout_pooled if pooled is None else pooled:   # or a pool, where cheaper
        p = _best_pooled(tuple(jobs), cap, max_rollout_nodes, turns)
        if p is not None and (g is None or cap.rate_of(p) < cap.rate_of(g) * (1 - 1e-9)):
            g = p
    if cap.colocation and len(jobs) == 1 and jobs[0].colo_iter_s > 0 and not jobs[0].solo:
        c = colocated_group(group_id, jobs[0])
        if cap.fits(c) and (g is None or cap.rate_of(c) < cap.rate_of(g) * (1 - 1e-9)):
            g = c
    return None if g is None else (g if g.group_id == group_id
                                   else replace(g, group_id=group_id))


def turn_sets(jobs: Sequence[JobProfile]) -> tuple[tuple[int, ...], ...]:
    """The turns a group of exactly ``jobs`` is planned with, in order of preference:
    each job as many turns as fit in the longest one's iteration, then one each."""
    ones = (1,) * len(jobs)
    solos = [j.solo_s for j in jobs]
    if not solos or max(solos) < 2 * min(solos):   # no job fits twice in another's
        return (ones,)
    longest = max(solos)
    fitted = tuple(turns_for(longest, j) for j in jobs)
    return (fitted, ones) if fitted != ones else (ones,)


def _could_meet_slos(jobs: Sequence[JobProfile], pins: Sequence[tuple[int, ...]],
                     turns: Sequence[int], rollout_nodes: int) -> bool:
    """Necessary conditions, whatever the cyclic order, for ``jobs`` pinned so with these
    turns to meet every SLO: the period is at least :func:`period_floor_s` and each
    rollout node's load; a member taking turns has its nodes to itself (``turns_apart``)."""
    budget = min(k * j.budget_s for k, j in zip(turns, jobs, strict=True)) * (1 + 1e-9)
    if period_floor_s(jobs, turns) > budget:
        return False
    load = [0.0] * rollout_nodes
    for k, j, ps in zip(turns, jobs, pins, strict=True):
        for p in ps:
            load[p] += k * j.rollout_max_s
    return max(load) <= budget and turns_apart(pins, turns, rollout_nodes)


@lru_cache(maxsize=1 << 15)
def _best_group(jobs: tuple[JobProfile, ...], cap: Capacity,
                max_rollout_nodes: int | None, turns: bool) -> Group | None:
    group_id = 0
    n = len(jobs)
    train_nodes = max(j.train_nodes for j in jobs)
    limit = cap.max_rollout_nodes_per_group if max_rollout_nodes is None else max_rollout_nodes
    sets = turn_sets(jobs) if turns else ((1,) * n,)
    best: Group | None = None
    best_rate = 0.0
    for pins in _pinnings_by_nodes(tuple(j.rollout_nodes for j in jobs)):
        rollout_nodes = 1 + max(p for member in pins for p in member)
        if (rollout_nodes > limit and n > 1) or (best is not None
                                                 and rollout_nodes > best.rollout_nodes):
            break
        for each in sets:
            if not _could_meet_slos(jobs, pins, each, rollout_nodes):
                continue   # no cyclic order can: skip them all
            for rest in itertools.permutations(range(1, n)):
                order = (0, *rest)
                group = Group(group_id, tuple(Member(jobs[i], pins[i], each[i])
                                              for i in order), rollout_nodes, train_nodes)
                if cap.fits(group):
                    rate = group_work_rate(group, cap)
                    if rate > best_rate * (1 + 1e-9):
                        best, best_rate = group, rate
    return best


@lru_cache(maxsize=1 << 15)
def _best_pooled(jobs: tuple[JobProfile, ...], cap: Capacity,
                 max_rollout_nodes: float | None, turns: bool) -> Group | None:
    """The pooled group of exactly ``jobs`` on the fewest GPUs (every cyclic order up to
    rotation, each of :func:`turn_sets`; ties: the first found)."""
    limit = cap.max_rollout_nodes_per_group if max_rollout_nodes is None else max_rollout_nodes
    hi = min(max_pool_gpus(cap), math.floor(limit * cap.rollout_gpus_per_node + 1e-9))
    best: Group | None = None
    n = len(jobs)
    for each in (turn_sets(jobs) if turns else ((1,) * n,)):
        for rest in itertools.permutations(range(1, n)):
            members = [Member(jobs[i], (0,), each[i]) for i in (0, *rest)]
            found = fewest_gpus(0, members, cap, 1, hi if best is None else best.pool_gpus - 1)
            if found is not None:
                best = found
    return best
