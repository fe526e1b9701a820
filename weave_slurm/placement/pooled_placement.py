"""Where an arrival goes when weave's groups pool their rollout side (pure).

Pooled groups (:mod:`weave_slurm.placement.pooled`) have no rollout pins to choose,
only a width, so the tiers of :class:`~weave_slurm.placement.engine.WeavePolicy`
(direct packing, rollout scaling, a new group) become one comparison. Each group the
job may join (:func:`~weave_slurm.placement.fit.may_fit`) is tried with the newcomer at
every cyclic position (and, where the policy lets joins take turns, with its turns);
the order that needs the fewest GPUs is kept, on the width that delivers the group's
work cheapest (:func:`~weave_slurm.placement.pooled.efficient_width`: the pool may
widen, as rollout scaling, or not, as direct packing). Against these stands a pool of
its own, on its cheapest width too. The winner leaves the cluster's cost per unit of
work lowest (its cost per hour over the busy-time value its members deliver per hour,
as the zero-bubble bound prices it: the consistent accounting's measure); ties go to
the most relative slack of the tightest member (worst fit, as for pinned groups), then
to the lowest group id, a new group last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Admission, Decision, Placement
from weave_slurm.placement.fit import capacity_refusal, may_fit, turn_options
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.pooled import (
    efficient_width,
    fewest_gpus,
    least_gpus,
    max_pool_gpus,
    step_gpus,
)
from weave_slurm.placement.work import group_work_rate, member_value

_EPS = 1e-9


def place_pooled(state: ClusterState, job: JobProfile, join_turns: bool) -> Decision:
    """Place ``job`` among pooled groups (a job that can never fit is refused by the
    caller first). Groups are examined in order of a lower bound on the cluster's cost
    per unit of work with the job in them (:func:`_bound`, O(members)), and the search
    stops once no remaining bound can beat the best exact outcome (branch and bound)."""
    cap = state.capacity
    free_t = cap.train_pool_nodes - state.train_nodes_used
    free_gpus = math.floor((cap.rollout_pool_nodes - state.rollout_nodes_used)
                           * cap.rollout_gpus_per_node + _EPS)
    cost, work = state.cost_per_hour, state.work_per_hour

    def ratio(old: Group | None, placed: Placement) -> float:
        """The cluster's cost per unit of work once ``placed`` replaces ``old``."""
        before = 0.0 if old is None else group_work_rate(old, cap)
        return (cost + placed.cost_delta_per_hour) / max(
            work + group_work_rate(placed.group, cap) - before, _EPS)

    best: tuple[tuple[float, float, float], Placement] | None = None
    fresh = _fresh(state, job, free_gpus)
    if fresh is not None:
        best = ((round(ratio(None, fresh), 12), -_slack(fresh.group), math.inf), fresh)
    groups = [(_bound(g, job, cap, cost, work, join_turns), g) for g in _open_pools(state)
              if may_fit(g, job, cap, free_t, join_turns)]
    groups.sort(key=lambda bg: (bg[0], bg[1].group_id))
    for bound, g in groups:
        if best is not None and bound > best[0][0] + 1e-9:
            break   # sorted: no group left can do better
        cutoff = math.inf if best is None else best[0][0] + 1e-9

        def beaten(gpus: int, members: tuple[Member, ...], old: Group = g,
                   cutoff: float = cutoff) -> bool:
            return _ratio_bound(old, members, gpus, cap, cost, work) > cutoff

        joined = _joined(g, job, cap, join_turns, free_gpus, beaten)
        if joined is None:
            continue
        key = (round(ratio(g, joined), 12), -_slack(joined.group), float(g.group_id))
        if best is None or key < best[0]:
            best = (key, joined)
    return best[1] if best is not None else capacity_refusal(state, job)


def _open_pools(state: ClusterState) -> tuple[Group, ...]:
    """The open pooled groups of ``state`` with room for one more member."""
    most = state.capacity.max_group_size
    return state.once("open_pools", lambda: tuple(
        g for g in state.open_groups() if g.pooled and g.size < most))


def _bound(g: Group, job: JobProfile, cap: Capacity, cost: float, work: float,
           join_turns: bool) -> float:
    """A lower bound on the cluster's cost per unit of work with ``job`` in ``g``
    (:func:`_ratio_bound` on the fewest GPUs its rollouts could fit the tightest budget
    on, ``least_gpus``), over ``job``'s turn options."""
    best = math.inf
    for turns in turn_options(g, job, join_turns):
        members = (*g.members, Member(job, (0,), turns))
        gpus = max(step_gpus([m.job for m in members]),
                   least_gpus(members, cap.rollout_gpus_per_node))
        best = min(best, _ratio_bound(g, members, gpus, cap, cost, work))
    return best


def _ratio_bound(g: Group, members: Sequence[Member], gpus: int, cap: Capacity,
                 cost: float, work: float) -> float:
    """A lower bound on the cluster's cost per unit of work with ``members`` in place of
    ``g``'s on at least ``gpus`` GPUs: the pool costs at least its training nodes and
    those GPUs, and delivers at most its members' value over the longest of its
    serialised training and its rollouts at their floors."""
    train_s = sum(m.turns * m.job.train_mean_s for m in members)
    floor_s = sum(m.turns * m.job.rollout_mean_s * m.job.rollout_floor_fraction
                  for m in members)
    value = sum(member_value(m, cap) for m in members)
    rate = cap.rates.rate(gpus / cap.rollout_gpus_per_node,
                          max(m.job.train_nodes for m in members))
    gained = value / max(train_s, floor_s, _EPS) - group_work_rate(g, cap)
    return (cost + rate - cap.rate_of(g)) / max(work + gained, _EPS)


def _orders(group: Group, job: JobProfile, join_turns: bool
            ) -> Iterator[tuple[Member, ...]]:
    """The group's members with ``job`` at each cyclic position, with each of its turn
    options."""
    for turns in turn_options(group, job, join_turns):
        member = Member(job, (0,), turns)
        for pos in range(group.size, -1, -1):
            yield (*group.members[:pos], member, *group.members[pos:])


def _slack(group: Group) -> float:
    return 1.0 - group.schedule.period_s / group.min_budget_s


def _joined(g: Group, job: JobProfile, cap: Capacity, join_turns: bool,
            free_gpus: int, beaten: Callable[[int, tuple[Member, ...]], bool]
            ) -> Placement | None:
    """``job`` in pooled group ``g`` (module doc), or None where it cannot join or where
    ``beaten(gpus, members)`` says that no width from its fewest feasible one on can beat
    the best placement found so far (it skips the search for the cheapest width)."""
    hi = min(max_pool_gpus(cap), g.pool_gpus + free_gpus)
    best: tuple[tuple[int, float], Group] | None = None
    for members in _orders(g, job, join_turns):
        found = fewest_gpus(g.group_id, members, cap, 1, hi if best is None else best[0][0])
        if found is not None:
            key = (found.pool_gpus, -_slack(found))
            if best is None or key < best[0]:
                best = (key, found)
    if best is None or beaten(best[1].pool_gpus, best[1].members):
        return None
    new = efficient_width(g.group_id, best[1].members, cap, 1, hi, narrow=best[1])
    if new is None:
        return None
    added_r = (new.pool_gpus - g.pool_gpus) / cap.rollout_gpus_per_node
    added_t = max(0, new.train_nodes - g.train_nodes)
    kind = Admission.SCALE_ROLLOUT if added_r > 0 else Admission.DIRECT
    return Placement(job.job_id, kind, new, cap.rates.rate(added_r, added_t), added_r,
                     added_t)


def _fresh(state: ClusterState, job: JobProfile, free_gpus: int) -> Placement | None:
    """A pool of its own, on the width that delivers its work cheapest: a lone job's
    training node waits for its rollout, so GPUs that shorten it may pay."""
    cap = state.capacity
    if state.train_nodes_used + job.train_nodes > cap.train_pool_nodes:
        return None
    group = efficient_width(state.next_group_id, (Member(job, (0,)),), cap, 1,
                            min(max_pool_gpus(cap), free_gpus))
    if group is None:
        return None
    nodes = group.rollout_held_nodes
    return Placement(job.job_id, Admission.NEW_GROUP, group,
                     cap.rates.rate(nodes, job.train_nodes), nodes, job.train_nodes)
