"""The state placement decides over: the active groups within the pools' capacity
(:class:`~weave_slurm.placement.capacity.Capacity`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TypeVar, cast

from weave_slurm.errors import StateError
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.pooled import narrowed
from weave_slurm.placement.work import group_work_rate

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterState:
    capacity: Capacity
    groups: tuple[Group, ...] = ()
    next_group_id: int = 1
    # groups no job may join now (weaved: a move out of them waits for nodes elsewhere,
    # so they run a plan placement does not see whole); their nodes still count as used
    closed: frozenset[int] = frozenset()
    # what placement worked out of this state once (it never changes; a new state,
    # from ``replace`` too, starts empty): :meth:`once`
    memo: dict[str, object] = field(default_factory=dict, init=False, compare=False,
                                    repr=False)

    def once(self, key: str, build: Callable[[], T]) -> T:
        """``build()``, worked out once per state under ``key`` (a batch, a re-plan and
        the benchmark place many jobs on one state)."""
        if key not in self.memo:
            self.memo[key] = build()
        return cast(T, self.memo[key])

    def open_groups(self) -> tuple[Group, ...]:
        """The groups a job may join."""
        if not self.closed:
            return self.groups
        return tuple(g for g in self.groups if g.group_id not in self.closed)

    @cached_property
    def by_id(self) -> dict[int, Group]:
        return {g.group_id: g for g in self.groups}

    @cached_property
    def job_group(self) -> dict[str, int]:
        return {jid: g.group_id for g in self.groups for jid in g.job_ids}

    @cached_property
    def rollout_nodes_used(self) -> float:
        """Rollout nodes held (a pooled group's GPUs count as the nodes' share they are)."""
        return sum(g.rollout_held_nodes for g in self.groups)

    @cached_property
    def train_nodes_used(self) -> int:
        return sum(g.train_nodes for g in self.groups)

    @property
    def cost_per_hour(self) -> float:
        return self.capacity.rates.rate(self.rollout_nodes_used, self.train_nodes_used)

    @cached_property
    def work_per_hour(self) -> float:
        """Busy-time value of all members per hour (placement/work.py): what the pools
        would cost with no bubble."""
        return sum(group_work_rate(g, self.capacity) for g in self.groups)

    @property
    def jobs(self) -> int:
        return len(self.job_group)


def apply(state: ClusterState, placement: Placement) -> ClusterState:
    """The state after a placement (pure)."""
    if placement.job_id in state.job_group:
        raise StateError(f"job {placement.job_id} is already placed in group "
                         f"{state.job_group[placement.job_id]}")
    gid = placement.group.group_id
    if gid in state.by_id:
        groups = tuple(placement.group if g.group_id == gid else g for g in state.groups)
        return replace(state, groups=groups)
    return replace(state, groups=(*state.groups, placement.group),
                   next_group_id=max(state.next_group_id, gid + 1))


def depart(state: ClusterState, job_id: str) -> ClusterState:
    """The state after a job leaves: its group re-plans, shrinks or dissolves (pure)."""
    gid = state.job_group.get(job_id)
    if gid is None:
        raise StateError(f"job {job_id} is not placed")
    group = state.by_id[gid]
    members = tuple(m for m in group.members if m.job.job_id != job_id)
    if not members:
        return replace(state, groups=tuple(g for g in state.groups if g.group_id != gid))
    shrunk = compact(replace_members(group, members), state.capacity)
    return replace(state, groups=tuple(shrunk if g.group_id == gid else g for g in state.groups))


def replace_members(group: Group, members: tuple[Member, ...]) -> Group:
    """A group with new members, releasing rollout nodes nobody is pinned to."""
    used = sorted({p for m in members for p in m.rollout_pins})
    remap = {old: new for new, old in enumerate(used)}
    # Turns relative to each other: a member left alone takes one turn again.
    common = math.gcd(*(m.turns for m in members)) if members else 1
    members = tuple(Member(m.job, tuple(remap[p] for p in m.rollout_pins),
                           m.turns // common) for m in members)
    return replace(group, members=members, rollout_nodes=len(used),
                   train_nodes=max(m.job.train_nodes for m in members))


def compact(group: Group, cap: Capacity) -> Group:
    """Release rollout nodes by re-pinning members onto others while all stay feasible.

    Run when a member leaves. Moving a member's rollout pin moves its warm rollout
    state to another node of the same group over the fast intra-pool fabric.
    """
    if group.colocated:
        return group
    if group.pooled:   # its pool narrows to the fewest GPUs the others' SLOs allow
        return narrowed(group, cap) or group
    best = group
    improved = True
    while improved and best.rollout_nodes > 1:
        improved = False
        load = best.rollout_load_s
        for node in sorted(range(best.rollout_nodes), key=lambda n: load[n]):
            candidate = _evacuate(best, node, cap)
            if candidate is not None:
                best, improved = candidate, True
                break
    return best


def _evacuate(group: Group, node: int, cap: Capacity) -> Group | None:
    members = list(group.members)
    others = [n for n in range(group.rollout_nodes) if n != node]
    for i, m in enumerate(members):
        if node not in m.rollout_pins:
            continue
        placed = False
        for target in sorted(others, key=lambda n: group.rollout_load_s[n]):
            if target in m.rollout_pins:
                continue
            pins = tuple(target if p == node else p for p in m.rollout_pins)
            trial = members.copy()
            trial[i] = Member(m.job, pins, m.turns)
            if cap.fits(replace_members(group, tuple(trial))):
                members = trial
                placed = True
                break
        if not placed:
            return None
    return replace_members(group, tuple(members))

