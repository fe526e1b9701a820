"""Co-execution groups: members, their pinning to nodes, and the resulting schedule.

A group owns ``rollout_nodes`` h20 nodes and ``train_nodes`` h800 nodes. Each member
is pinned to ``job.rollout_nodes`` of the rollout nodes (several members may share a
rollout node and then take turns) and trains on the first ``job.train_nodes``
training nodes, so training is serialised across members, as in the reference. The
members' tuple order is the cyclic round-robin order on every node.

A *pooled* group (``pool_gpus`` > 0, docs/placement.md "Pooled rollout") holds its
rollout side as ``pool_gpus`` GPUs instead of whole nodes: every member's rollout
spans all of them, one member at a time in the cyclic (turn) order, so its rollout
takes its time times ``job.width_factor(pool_gpus)``. In the schedule the pool is one
rollout "node" (``rollout_nodes`` 1, every member pinned to it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cyclic import MAX_TURNS, cyclic_period

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Member:
    job: JobProfile
    rollout_pins: tuple[int, ...]
    # Iterations per meta-iteration: a job several times shorter than the group's
    # longest takes that many turns (placement/cyclic.py slot_order), so jobs of unlike
    # lengths share nodes without the short one waiting a long cycle per step.
    turns: int = 1

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
    # device memory per GPU of each node in its peak case (Group.rollout_gpu_used_gib)
    rollout_gpu_mem_gib: tuple[float, ...] = ()
    train_gpu_mem_gib: tuple[float, ...] = ()

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
    pool_gpus: int = 0  # > 0: a pooled group's rollout GPUs (module doc)
    gpus_per_node: int = 8  # of the rollout pool (what a pooled group's GPUs are worth)
    # what placement worked out of this group once, by capacity (the group never
    # changes; ``replace`` starts a new one empty): colocation._stays
    memo: dict[int, tuple[object, bool]] = field(default_factory=dict, init=False,
                                                 compare=False, repr=False)

    @property
    def pooled(self) -> bool:
        return self.pool_gpus > 0

    @cached_property
    def rollout_held_nodes(self) -> float:
        """Rollout nodes' worth the group holds (and pays): a pooled group's GPUs in
        nodes."""
        return self.pool_gpus / self.gpus_per_node if self.pooled else self.rollout_nodes

    @cached_property
    def rollout_factors(self) -> tuple[float, ...] | None:
        """Each member's rollout time over its profile's at the pool's width (pooled
        groups; None: every member at its own width)."""
        if not self.pooled:
            return None
        return tuple(m.job.width_factor(self.pool_gpus, self.gpus_per_node)
                     for m in self.members)

    def rollout_busy_node_s(self, index: int) -> float:
        """Rollout node-seconds one iteration of member ``index`` keeps busy here
        (expected durations)."""
        m = self.members[index]
        r = m.job.rollout_mean_s
        if self.rollout_factors is None:
            return r * len(m.rollout_pins)
        return r * self.rollout_factors[index] * self.rollout_held_nodes

    @property
    def size(self) -> int:
        return len(self.members)

    @cached_property
    def disaggregated(self) -> Group:
        """A co-located group's job alone on rollout and training nodes of its own (what
        a newcomer joining it starts from: placement/colocation.py); the group itself
        otherwise."""
        if not self.colocated:
            return self
        return solo_group(self.group_id, self.members[0].job)

    @cached_property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(m.job.job_id for m in self.members)

    @cached_property
    def schedule(self) -> GroupSchedule:
        return evaluate(self)

    @cached_property
    def turns(self) -> tuple[int, ...]:
        """Iterations each member runs per meta-iteration (:attr:`Member.turns`)."""
        return tuple(m.turns for m in self.members)

    @cached_property
    def cycle_s(self) -> float:
        """The longest member's share of a meta-iteration run alone: max of turns x solo
        iteration (a lower bound on the period)."""
        return max((m.turns * m.job.solo_s for m in self.members), default=0.0)

    @cached_property
    def train_load_s(self) -> float:
        return sum(m.turns * m.job.train_max_s for m in self.members)

    @cached_property
    def train_mem_gib(self) -> float:
        """Host memory used on training node 0, which every member trains on; a
        co-located member keeps both roles' warm state on its training nodes (its
        rollout state spread over them)."""
        if self.colocated:
            j = self.members[0].job
            return j.train_state_gib + j.rollout_state_gib * j.rollout_nodes / self.train_nodes
        return sum(m.job.train_state_gib for m in self.members)

    @cached_property
    def min_budget_s(self) -> float:
        """The longest period every member's SLO allows: min of turns x budget."""
        return min((m.turns * m.job.budget_s for m in self.members), default=float("inf"))

    @cached_property
    def rollout_load_s(self) -> tuple[float, ...]:
        load = [0.0] * self.rollout_nodes
        factors = self.rollout_factors or (1.0,) * self.size
        for m, f in zip(self.members, factors, strict=True):
            for node in m.rollout_pins:
                load[node] += m.turns * m.job.rollout_max_s * f
        return tuple(load)

    @cached_property
    def rollout_mem_used_gib(self) -> tuple[float, ...]:
        """Host memory used on each rollout node; a pooled group's per whole node of its
        GPUs (every member holds its share on each of them: its state per GPU)."""
        mem = [0.0] * self.rollout_nodes
        gpn = self.gpus_per_node
        for m in self.members:
            j = m.job
            state = j.rollout_state_gib * gpn / min(j.base_gpus(gpn), gpn) if self.pooled \
                else j.rollout_state_gib
            for node in m.rollout_pins:
                mem[node] += state
        return tuple(mem)

    @cached_property
    def rollout_gpu_used_gib(self) -> tuple[float, ...]:
        """Per rollout node, a GPU's device memory in its peak case: what every member
        pinned there holds switched out, plus the largest active excess over it (the
        engines of a node start at GPU 0, so every member pinned there shares GPU 0)."""
        held = [0.0] * self.rollout_nodes
        extra = [0.0] * self.rollout_nodes
        for m in self.members:
            j = m.job
            r, x = j.rollout_gpu_resident_gib, j.rollout_gpu_peak_gib - j.rollout_gpu_resident_gib
            for node in m.rollout_pins:
                held[node] += r
                if x > extra[node]:
                    extra[node] = x
        return tuple(h + x for h, x in zip(held, extra, strict=True))

    @cached_property
    def train_gpu_used_gib(self) -> tuple[float, ...]:
        """Per training node, the same for the members training there (node ``i``: those
        with more than ``i`` training nodes; local rank 0 is GPU 0 on every node). The
        co-located baseline's one member: its ``colo_gpu_peak_gib`` on every node."""
        if self.colocated:
            return (self.members[0].job.colo_gpu_peak_gib,) * self.train_nodes
        held = [0.0] * self.train_nodes
        extra = [0.0] * self.train_nodes
        for m in self.members:
            j = m.job
            r, x = j.train_gpu_resident_gib, j.train_gpu_peak_gib - j.train_gpu_resident_gib
            for node in range(j.train_nodes):
                held[node] += r
                if x > extra[node]:
                    extra[node] = x
        return tuple(h + x for h, x in zip(held, extra, strict=True))

    @cached_property
    def train_gpu_parts(self) -> tuple[float, float]:
        """``(resident sum, largest active excess)`` on training node 0, which every
        member trains on (the busiest GPU: placement's O(1) prune adds a newcomer to it)."""
        if self.colocated:
            return 0.0, self.members[0].job.colo_gpu_peak_gib
        held = extra = 0.0
        for m in self.members:
            j = m.job
            held += j.train_gpu_resident_gib
            extra = max(extra, j.train_gpu_peak_gib - j.train_gpu_resident_gib)
        return held, extra

    @cached_property
    def node_min_budget_s(self) -> tuple[float, ...]:
        """Smallest member budget (turns x budget) among the members pinned to each
        rollout node."""
        out = [float("inf")] * self.rollout_nodes
        for m in self.members:
            for node in m.rollout_pins:
                out[node] = min(out[node], m.turns * m.job.budget_s)
        return tuple(out)

    @cached_property
    def period_s(self) -> float:
        """Meta-iteration period under the admission bound (what feasibility needs)."""
        if self.colocated:
            return self.members[0].job.colo_iter_s
        return period(self.members, factors=self.rollout_factors)

    def feasible(self, rollout_mem_gib: float, train_mem_gib: float,
                 rollout_gpu_mem_gib: float = math.inf,
                 train_gpu_mem_gib: float = math.inf) -> bool:
        """Every member within its SLO, every node within its host memory and every GPU
        within its device memory (``*_gpu_mem_gib``: per GPU; inf: not checked)."""
        if any(x > rollout_mem_gib + _EPS for x in self.rollout_mem_used_gib):
            return False
        if self.train_mem_gib > train_mem_gib + _EPS:
            return False
        if train_gpu_mem_gib < math.inf:
            held, extra = self.train_gpu_parts
            if held + extra > train_gpu_mem_gib + _EPS:
                return False
        if rollout_gpu_mem_gib < math.inf and \
                any(x > rollout_gpu_mem_gib + _EPS for x in self.rollout_gpu_used_gib):
            return False
        if not self.pooled and not self.turns_apart:   # a pool keeps to the turn order
            return False
        if self.colocated:
            # a co-located iteration is an expected time (the simulator's) or an
            # admission bound (profile_job's): within the SLO of the expected solo one
            j = self.members[0].job
            return j.colo_iter_s > 0 and within_budget(j.colo_iter_s, j.slo * j.solo_mean_s)
        return within_budget(self.period_s, self.min_budget_s)

    @cached_property
    def turns_apart(self) -> bool:
        """:func:`turns_apart` of this group's pins and turns."""
        return turns_apart([m.rollout_pins for m in self.members], self.turns,
                           self.rollout_nodes)


def within_budget(period_s: float, budget_s: float) -> bool:
    """Whether a period keeps within an SLO budget (the one tolerance of placement's
    SLO tests: a relative and an absolute epsilon)."""
    return period_s <= budget_s * (1 + _EPS) + _EPS


def turns_apart(pins: Sequence[Sequence[int]], turns: Sequence[int],
                rollout_nodes: int) -> bool:
    """Whether every member taking several turns has its rollout nodes to itself: the
    runtime's training nodes keep to the turn order, but its rollout nodes serve whoever
    is ready (work-conserving), so only a rollout node's sole member is sure to take its
    turns there as planned."""
    if all(k == 1 for k in turns):
        return True
    users = [0] * rollout_nodes
    for ps in pins:
        for node in ps:
            users[node] += 1
    return all(users[node] == 1 for k, ps in zip(turns, pins, strict=True) if k > 1
               for node in ps)


def period_floor_s(jobs: Sequence[JobProfile], turns: Sequence[int]) -> float:
    """A lower bound on the period of ``jobs`` with these turns, whatever their pins and
    order (the admission bound): the training node's load and each member's own turns."""
    pairs = tuple(zip(turns, jobs, strict=True))
    return max(sum(k * j.train_max_s for k, j in pairs), max(k * j.solo_s for k, j in pairs))


def turns_for(cycle_s: float, job: JobProfile) -> int:
    """How many turns ``job`` takes in a meta-iteration of about ``cycle_s``: as many of
    its solo iterations as fit (at least one)."""
    if job.solo_s <= 0:
        return 1
    return max(1, min(MAX_TURNS, math.floor(cycle_s / job.solo_s + 1e-9)))


@lru_cache(maxsize=1 << 16)
def period(members: tuple[Member, ...], expected: bool = False,
           factors: tuple[float, ...] | None = None) -> float:
    """Cyclic period of members in this order (memoised: placement, re-plans and the
    replay ask for the same member tuples many times); ``factors``: each member's
    rollout time over its profile's (a pooled group's width)."""
    jobs = [m.job for m in members]
    turns = [m.turns for m in members]
    scale = factors or (1.0,) * len(members)
    return cyclic_period(
        [(j.rollout_mean_s if expected else j.rollout_max_s) * f
         for j, f in zip(jobs, scale, strict=True)],
        [j.train_mean_s if expected else j.train_max_s for j in jobs],
        [j.sync_s for j in jobs],
        [m.rollout_pins for m in members],
        [m.train_pins for m in members],
        staleness=[j.staleness for j in jobs] if any(j.staleness for j in jobs) else None,
        turns=turns if any(k > 1 for k in turns) else None,
    )


def evaluate(group: Group) -> GroupSchedule:
    if group.colocated:
        return _evaluate_colocated(group)
    members = group.members
    p = group.period_s
    pe = period(members, expected=True, factors=group.rollout_factors)
    t_mem = [0.0] * group.train_nodes
    r_busy = t_busy = 0.0
    for i, m in enumerate(members):
        k = m.turns
        for node in m.train_pins:
            t_mem[node] += m.job.train_state_gib
        r_busy += k * group.rollout_busy_node_s(i)
        t_busy += k * m.job.train_mean_s * len(m.train_pins)
    held = group.rollout_held_nodes
    return GroupSchedule(
        period_s=p, expected_period_s=pe,
        slowdowns=tuple(p / (m.turns * m.job.solo_s) for m in members),
        rollout_busy=r_busy / (pe * held) if pe > 0 and held else 0.0,
        train_busy=t_busy / (pe * group.train_nodes) if pe > 0 and group.train_nodes else 0.0,
        rollout_mem_gib=group.rollout_mem_used_gib, train_mem_gib=tuple(t_mem),
        rollout_gpu_mem_gib=group.rollout_gpu_used_gib, train_gpu_mem_gib=group.train_gpu_used_gib)


def _evaluate_colocated(group: Group) -> GroupSchedule:
    # Both phases run on the same training GPUs, so there is no dependency bubble
    # to report: the cost of co-location shows up as a longer iteration instead.
    j = group.members[0].job
    return GroupSchedule(
        period_s=j.colo_iter_s, expected_period_s=j.colo_iter_s,
        slowdowns=(j.colo_iter_s / j.solo_s,), rollout_busy=0.0, train_busy=1.0,
        rollout_mem_gib=(), train_mem_gib=(group.train_mem_gib,) * group.train_nodes,
        train_gpu_mem_gib=group.train_gpu_used_gib)


def with_profile(group: Group, job: JobProfile) -> Group:
    """The group with the member of ``job.job_id`` planning with this profile (same pins
    and order), e.g. once its phase times were measured."""
    members = tuple(Member(job if m.job.job_id == job.job_id else m.job, m.rollout_pins,
                           m.turns) for m in group.members)
    return replace(group, members=members)


def colocated_group(group_id: int, job: JobProfile) -> Group:
    """The group of a job admitted co-located: both phases on its own training nodes
    (``colo_nodes``, else its training nodes), no rollout node."""
    return Group(group_id, (Member(job, ()),), rollout_nodes=0,
                 train_nodes=job.colo_nodes or job.train_nodes, colocated=True)


def solo_group(group_id: int, job: JobProfile) -> Group:
    """The group a job gets when provisioned in isolation."""
    return Group(group_id, (Member(job, tuple(range(job.rollout_nodes))),),
                 rollout_nodes=job.rollout_nodes, train_nodes=job.train_nodes)
