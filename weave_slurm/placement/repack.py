"""Re-planning one group from scratch: which members share which rollout nodes.

Used by the exact optimum (every group it considers) and by placement, which may
re-pin a small group's members when a newcomer joins: a re-pin moves a member's warm
rollout state between two nodes of the same group over the fast intra-pool fabric.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import cache

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cluster import Capacity
from weave_slurm.placement.group import Group, Member


def set_partitions(items: Sequence[int]) -> Iterator[list[list[int]]]:
    """All partitions of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


@cache
def _partitions_by_blocks(n: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    parts = [tuple(tuple(b) for b in p) for p in set_partitions(list(range(n)))]
    return tuple(sorted(parts, key=len))


def best_group(jobs: Sequence[JobProfile], cap: Capacity, group_id: int = 0,
               max_rollout_nodes: int | None = None) -> Group | None:
    """The cheapest feasible configuration of one group holding exactly ``jobs``.

    Configurations are tried in order of rollout node count, so the first feasible one
    at the smallest count is returned; ``max_rollout_nodes`` stops the search early.
    """
    n = len(jobs)
    train_nodes = max(j.train_nodes for j in jobs)
    limit = cap.max_rollout_nodes_per_group if max_rollout_nodes is None else max_rollout_nodes
    found: tuple[float, Group] | None = None
    for blocks in _partitions_by_blocks(n):
        widths = [max(jobs[i].rollout_nodes for i in b) for b in blocks]
        rollout_nodes = sum(widths)
        if rollout_nodes > limit and n > 1:
            continue
        cost = cap.rates.rate(rollout_nodes, train_nodes)
        if found is not None and cost >= found[0]:
            continue
        pins: dict[int, tuple[int, ...]] = {}
        offset = 0
        for block, width in zip(blocks, widths, strict=True):
            for i in block:
                pins[i] = tuple(range(offset, offset + jobs[i].rollout_nodes))
            offset += width
        for rest in itertools.permutations(range(1, n)):
            order = (0, *rest)
            group = Group(group_id, tuple(Member(jobs[i], pins[i]) for i in order),
                          rollout_nodes, train_nodes)
            if group.feasible(cap.rollout_mem_gib, cap.train_mem_gib):
                found = (cost, group)
                break
    return None if found is None else found[1]
