"""Exact minimum-cost grouping of a small job set (for measuring the greedy's gap).

Searches every partition of the jobs into groups of at most ``max_group_size``
members (dynamic programming over subsets), and inside each group every way of
sharing rollout nodes (set partitions of the members into rollout blocks, which
covers rollout scaling) and every cyclic order up to rotation. Cost is the summed
hourly rate of the groups' nodes. Exponential: meant for up to ~10 jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

from weave_slurm.errors import InfeasibleRequest
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Group
from weave_slurm.placement.repack import best_group

MAX_JOBS = 12


@dataclass(frozen=True, slots=True)
class Optimum:
    cost_per_hour: float
    groups: tuple[Group, ...]


def optimum(jobs: Sequence[JobProfile], cap: Capacity) -> Optimum:
    n = len(jobs)
    if n > MAX_JOBS:
        raise InfeasibleRequest(f"exact optimum is limited to {MAX_JOBS} jobs, got {n}")
    best = cheapest_grouping(jobs, cap)
    if best is None:
        raise InfeasibleRequest("no feasible grouping: some job cannot run even alone")
    return best


def cheapest_grouping(jobs: Sequence[JobProfile], cap: Capacity,
                      pooled: bool | None = None) -> Optimum | None:
    """The exact minimum-cost grouping of ``jobs`` (groups numbered from 1), or None when
    some job cannot run even alone; ``pooled`` as :func:`~.repack.best_group` takes it."""
    n = len(jobs)
    k = cap.max_group_size

    @cache
    def group_of(mask: int) -> Group | None:
        return best_group([jobs[i] for i in range(n) if mask >> i & 1], cap, pooled=pooled)

    @cache
    def solve(mask: int) -> tuple[float, tuple[int, ...]]:
        if mask == 0:
            return 0.0, ()
        low = mask & -mask
        rest = mask ^ low
        best: tuple[float, tuple[int, ...]] = (float("inf"), ())
        sub = rest
        while True:
            group_mask = sub | low
            if group_mask.bit_count() <= k:
                g = group_of(group_mask)
                if g is not None:
                    cost = cap.rate_of(g)
                    tail_cost, tail = solve(mask ^ group_mask)
                    if cost + tail_cost < best[0]:
                        best = (cost + tail_cost, (group_mask, *tail))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return best

    cost, masks = solve((1 << n) - 1)
    if cost == float("inf"):
        return None
    groups = []
    for gid, mask in enumerate(masks, start=1):
        g = group_of(mask)
        assert g is not None  # solve() only returns masks with a feasible group
        groups.append(replace(g, group_id=gid))
    return Optimum(cost, tuple(groups))
