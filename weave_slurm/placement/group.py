"""Co-execution groups: members, their pinning to nodes, and the resulting schedule.

A group owns ``rollout_nodes`` h20 nodes and ``train_nodes`` h800 nodes. Each member
is pinned to ``job.rollout_nodes`` of the rollout nodes (several members may share a
rollout node and then take turns) and trains on the first ``job.train_nodes``
training nodes, so training is serialised across members, as in the reference. The
members' tuple order is the cyclic round-robin order on every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cyclic import cyclic_period

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Member:
    job: JobProfile
    rollout_pins: tuple[int, ...]

    @property
    def train_pins(self) -> tuple[int, ...]:
        return tuple(range(self.job.train_nodes))


@dataclass(frozen=True, slots=True)
class GroupSchedule:
    """What the cyclic schedule of a group yields, under admission and expected times."""

    period_s: float  # admission bound: every rollout at max tokens
    expected_period_s: float  # expected durations; work-conserving run time
    slowdowns: tuple[float, ...]  # period / solo iteration, per member (admission)
    rollout_busy: float  # expected fraction of rollout node-time busy
    train_busy: float
    rollout_mem_gib: tuple[float, ...]  # per rollout node
    train_mem_gib: tuple[float, ...]  # per training node

    @property
    def max_slowdown(self) -> float:
        return max(self.slowdowns, default=1.0)


@dataclass(frozen=True)
class Group:
    group_id: int
    members: tuple[Member, ...]
    rollout_nodes: int
    train_nodes: int
    colocated: bool = False  # the co-located baseline: both phases on training nodes

    @property
    def size(self) -> int:
        return len(self.members)

    @cached_property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(m.job.job_id for m in self.members)

    @cached_property
    def schedule(self) -> GroupSchedule:
        return evaluate(self)

    @cached_property
    def train_load_s(self) -> float:
        return sum(m.job.train_max_s for m in self.members)

    @cached_property
    def train_mem_gib(self) -> float:
        """Host memory used on training node 0, which every member trains on."""
        return sum(m.job.train_state_gib for m in self.members)

    @cached_property
    def min_budget_s(self) -> float:
        return min((m.job.budget_s for m in self.members), default=float("inf"))

    @cached_property
    def rollout_load_s(self) -> tuple[float, ...]:
        load = [0.0] * self.rollout_nodes
        for m in self.members:
            for node in m.rollout_pins:
                load[node] += m.job.rollout_max_s
        return tuple(load)

    @cached_property
    def rollout_mem_used_gib(self) -> tuple[float, ...]:
        mem = [0.0] * self.rollout_nodes
        for m in self.members:
            for node in m.rollout_pins:
                mem[node] += m.job.rollout_state_gib
        return tuple(mem)

    @cached_property
    def node_min_budget_s(self) -> tuple[float, ...]:
        """Smallest member budget among the members pinned to each rollout node."""
        out = [float("inf")] * self.rollout_nodes
        for m in self.members:
            for node in m.rollout_pins:
                out[node] = min(out[node], m.job.budget_s)
        return tuple(out)

    @cached_property
    def period_s(self) -> float:
        """Meta-iteration period under the admission bound (what feasibility needs)."""
        if self.colocated:
            return self.members[0].job.colo_iter_s
        return period(self.members)

    def feasible(self, rollout_mem_gib: float, train_mem_gib: float) -> bool:
        """Every member within its SLO and every node within its host memory."""
        if any(x > rollout_mem_gib + _EPS for x in self.rollout_mem_used_gib):
            return False
        if self.train_mem_gib > train_mem_gib + _EPS:
            return False
        p = self.period_s
        return all(p <= m.job.budget_s * (1 + _EPS) + _EPS for m in self.members)


@lru_cache(maxsize=1 << 16)
def period(members: tuple[Member, ...], expected: bool = False) -> float:
    """Cyclic period of members in this order (memoised: placement, re-plans and the
    replay ask for the same member tuples many times)."""
    jobs = [m.job for m in members]
    return cyclic_period(
        [j.rollout_mean_s if expected else j.rollout_max_s for j in jobs],
        [j.train_mean_s if expected else j.train_max_s for j in jobs],
        [j.sync_s for j in jobs],
        [m.rollout_pins for m in members],
        [m.train_pins for m in members],
        staleness=[j.staleness for j in jobs] if any(j.staleness for j in jobs) else None,
    )


def evaluate(group: Group) -> GroupSchedule:
    if group.colocated:
        return _evaluate_colocated(group)
    members = group.members
    p = group.period_s
    pe = period(members, expected=True)
    r_mem = [0.0] * group.rollout_nodes
    t_mem = [0.0] * group.train_nodes
    r_busy = t_busy = 0.0
    for m in members:
        for node in m.rollout_pins:
            r_mem[node] += m.job.rollout_state_gib
        for node in m.train_pins:
            t_mem[node] += m.job.train_state_gib
        r_busy += m.job.rollout_mean_s * len(m.rollout_pins)
        t_busy += m.job.train_mean_s * len(m.train_pins)
    return GroupSchedule(
        period_s=p, expected_period_s=pe,
        slowdowns=tuple(p / m.job.solo_s for m in members),
        rollout_busy=r_busy / (pe * group.rollout_nodes) if pe > 0 and group.rollout_nodes else 0.0,
        train_busy=t_busy / (pe * group.train_nodes) if pe > 0 and group.train_nodes else 0.0,
        rollout_mem_gib=tuple(r_mem), train_mem_gib=tuple(t_mem))


def _evaluate_colocated(group: Group) -> GroupSchedule:
    # Both phases run on the same training GPUs, so there is no dependency bubble
    # to report: the cost of co-location shows up as a longer iteration instead.
    j = group.members[0].job
    return GroupSchedule(
        period_s=j.colo_iter_s, expected_period_s=j.colo_iter_s,
        slowdowns=(j.colo_iter_s / j.solo_s,), rollout_busy=0.0, train_busy=1.0,
        rollout_mem_gib=(), train_mem_gib=(j.train_state_gib,) * group.train_nodes)


def with_profile(group: Group, job: JobProfile) -> Group:
    """The group with the member of ``job.job_id`` planning with this profile (same pins
    and order), e.g. once its phase times were measured."""
    members = tuple(Member(job if m.job.job_id == job.job_id else m.job, m.rollout_pins)
                    for m in group.members)
    return Group(group.group_id, members, group.rollout_nodes, group.train_nodes,
                 group.colocated)


def solo_group(group_id: int, job: JobProfile) -> Group:
    """The group a job gets when provisioned in isolation."""
    return Group(group_id, (Member(job, tuple(range(job.rollout_nodes))),),
                 rollout_nodes=job.rollout_nodes, train_nodes=job.train_nodes)
