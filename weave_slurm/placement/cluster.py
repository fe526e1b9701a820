"""The state placement decides over: the active groups and the pools' capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from weave_slurm.config.site import SiteConfig
from weave_slurm.errors import StateError
from weave_slurm.model.cost import CostRates, MoveCost
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.pooled import narrowed


@dataclass(frozen=True, slots=True)
class Capacity:
    """Limits placement must respect, derived from the site config."""

    max_group_size: int
    max_rollout_nodes_per_group: int
    rollout_mem_gib: float
    train_mem_gib: float
    rollout_pool_nodes: int
    train_pool_nodes: int
    rates: CostRates
    moves: MoveCost = field(default_factory=MoveCost)  # what moving a running job costs
    # device memory of one GPU of each pool (GiB; the site's gpu hbm_gib; inf: unchecked)
    rollout_gpu_mem_gib: float = math.inf
    train_gpu_mem_gib: float = math.inf
    # weave's groups pool their rollout side in GPUs (docs/placement.md "Pooled
    # rollout"); rollout node counts above stay in nodes
    rollout_pooled: bool = False
    rollout_gpus_per_node: int = 8

    def rate_of(self, group: Group) -> float:
        """What ``group``'s nodes cost per hour (a pool's GPUs as the nodes' share)."""
        return self.rates.rate(group.rollout_held_nodes, group.train_nodes)

    def fits(self, group: Group) -> bool:
        """``group.feasible`` under these limits (host memory, device memory, SLOs)."""
        return group.feasible(self.rollout_mem_gib, self.train_mem_gib,
                              self.rollout_gpu_mem_gib, self.train_gpu_mem_gib)

    @classmethod
    def from_site(cls, site: SiteConfig, max_group_size: int | None = None,
                  pooled: bool = False) -> Capacity:
        return cls(
            rollout_pooled=pooled, rollout_gpus_per_node=site.rollout.gpus_per_node,
            max_group_size=max_group_size or site.limits.max_group_size,
            max_rollout_nodes_per_group=site.limits.max_rollout_nodes_per_group,
            rollout_mem_gib=site.rollout.host_mem_gib, train_mem_gib=site.train.host_mem_gib,
            rollout_pool_nodes=site.rollout.max_nodes, train_pool_nodes=site.train.max_nodes,
            rates=CostRates.from_site(site), moves=MoveCost.from_site(site),
            rollout_gpu_mem_gib=site.rollout.gpu.hbm_gib,
            train_gpu_mem_gib=site.train.gpu.hbm_gib)


@dataclass(frozen=True)
class ClusterState:
    capacity: Capacity
    groups: tuple[Group, ...] = ()
    next_group_id: int = 1
    # groups no job may join now (weaved: a move out of them waits for nodes elsewhere,
    # so they run a plan placement does not see whole); their nodes still count as used
    closed: frozenset[int] = frozenset()

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

