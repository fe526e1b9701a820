"""Co-location as an admission option: a job whose rollout runs on its own training
nodes (pure; docs/placement.md "Co-location").

verl's hybrid engine runs rollout and training on the same GPUs, switching the GPUs
between the two roles warm. Placed so, a job holds no rollout node: each iteration is
its rollout and its training serialised on its training GPUs plus the switch both
ways (``JobProfile.colo_iter_s``), on ``colo_nodes`` training nodes, with both roles'
warm state in their host memory and its co-located peak on their GPUs
(:meth:`Group.feasible <weave_slurm.placement.group.Group.feasible>`). Nothing idles
there, but the training GPUs, the dear ones, do the rollout too.

Three pieces, all used by :class:`~weave_slurm.placement.engine.WeavePolicy` where
``Capacity.colocation`` is on:

- :func:`colocation_placement`: the job in a co-located group of its own;
- :func:`may_join_colocated` / :func:`join_colocated`: a later arrival joins a
  co-located job, which goes back to disaggregation beside it (a group of the two on
  the co-located job's training node and rollout nodes added for both), so co-locating
  a job never closes it to the groups it could anchor later;
- :func:`cheaper_per_work`: of the options, the one that leaves the cluster's cost per
  unit of work lowest (its cost per hour over the busy-time value its members deliver
  per hour, placement/work.py: the consistent accounting's measure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Admission, Placement
from weave_slurm.placement.fit import may_fit
from weave_slurm.placement.group import Group, Member, colocated_group
from weave_slurm.placement.repack import best_group
from weave_slurm.placement.work import group_work_rate, member_value

_EPS = 1e-9


def colocation_placement(state: ClusterState, job: JobProfile) -> Placement | None:
    """``job`` co-located on training nodes of its own, or None where the capacity does
    not allow co-location, the job has no co-located time, is ``solo`` (it runs as
    declared, disaggregated), or breaks its SLO, the nodes' host or GPU memory, or the
    training pool's size co-located."""
    cap = state.capacity
    if not cap.colocation or job.colo_iter_s <= 0 or job.solo:
        return None
    group = colocated_group(state.next_group_id, job)
    if state.train_nodes_used + group.train_nodes > cap.train_pool_nodes:
        return None
    if not cap.fits(group):
        return None
    return Placement(job.job_id, Admission.COLOCATED, group, cap.rate_of(group), 0,
                     group.train_nodes)


def beats_grouping(colo: Placement, cap: Capacity) -> bool:
    """Whether ``colo`` (a job co-located) costs less per unit of work than any group of
    jobs like it could disaggregated (:func:`grouped_floor`). Where it does not, a job
    that can join a group joins it: a group's first members cost more per unit of work
    than co-location, its later ones less, so comparing each arrival's options alone
    would co-locate every job and grow no group."""
    return _beats(colo.group, cap)


def _beats(group: Group, cap: Capacity) -> bool:
    job = group.members[0].job
    own = cap.rate_of(group) * group.schedule.expected_period_s
    return own / member_value(group.members[0], cap) < grouped_floor(job, cap)


def closed_group_profile(job: JobProfile, cap: Capacity, barred: bool) -> JobProfile:
    """``job`` as placement decides it where a co-located group takes no newcomer
    (weaved's: daemon/colocating.py; the simulator's ``weave-live``: sim/live.py):
    without co-located time (placement never co-locates a job without one) where it is
    ``barred`` (its runtime could not run it co-located) or where its co-location does
    not beat any group of jobs like it (:func:`beats_grouping`): co-located there, it
    would stay alone for life, dearer than the group it could have started."""
    if cap.colocation and job.colo_iter_s > 0 and (
            barred or not _beats(colocated_group(0, job), cap)):
        return replace(job, colo_iter_s=0.0)
    return job


def grouped_floor(job: JobProfile, cap: Capacity) -> float:
    """The least cost per unit of work of ``n`` jobs like ``job`` (``n`` up to the
    largest group) sharing one training node within its SLO: period at least ``n``
    trainings and its solo iteration, on the fewest rollout nodes that hold ``n``
    rollouts per period (expected times; inf where even one cannot)."""
    value = member_value(Member(job, ()), cap)
    best = math.inf
    for n in range(1, cap.max_group_size + 1):
        period = max(n * job.train_max_s, job.solo_s)
        if period > job.budget_s * (1 + _EPS) or value <= 0:
            break
        nodes = max(job.rollout_nodes,
                    math.ceil(n * job.rollout_max_s * job.rollout_nodes / period - _EPS))
        expected = max(n * job.train_mean_s, job.solo_mean_s)
        best = min(best, cap.rates.rate(nodes, job.train_nodes) * expected / (n * value))
    return best


def may_join_colocated(group: Group, job: JobProfile | None, cap: Capacity, free_t: int,
                       turns: bool = False) -> bool:
    """Whether ``job`` may join co-located ``group``: not where that job's co-location
    beats any grouping of jobs like it (:func:`beats_grouping`: it stays co-located),
    and the O(1) necessary conditions of :func:`~weave_slurm.placement.fit.may_fit` for
    its job alone, disaggregated (``job`` None: the group's part alone)."""
    return group.colocated and not _stays(group, cap) and (
        job is None or may_fit(group.disaggregated, job, cap, free_t, turns))


def _stays(group: Group, cap: Capacity) -> bool:
    """:func:`beats_grouping` of a co-located group's job (memoised on the group, per
    capacity: placement asks about every co-located group on every arrival)."""
    hit = group.memo.get(id(cap))
    if hit is not None and hit[0] is cap:
        return hit[1]
    stays = _beats(group, cap)
    group.memo[id(cap)] = (cap, stays)   # holding the capacity keeps its id unique
    return stays


def join_colocated(group: Group, job: JobProfile, cap: Capacity, free_r: float,
                   free_t: int, turns: bool = False) -> Placement | None:
    """``job`` beside co-located ``group``'s job, both disaggregated: the cheapest
    pinning of the two on new rollout nodes (``repack.best_group``), or None."""
    limit = min(cap.max_rollout_nodes_per_group, math.floor(free_r + _EPS))
    if limit < 1:
        return None
    g = best_group([group.members[0].job, job], cap, group.group_id,
                   max_rollout_nodes=limit, turns=turns, pooled=False)
    if g is None or g.train_nodes - group.train_nodes > free_t:
        return None
    added_t = g.train_nodes - group.train_nodes   # below 0 where it trained on fewer
    return Placement(job.job_id, Admission.SCALE_ROLLOUT, g,
                     cap.rate_of(g) - cap.rate_of(group), g.rollout_nodes, added_t)


def cheaper_per_work(state: ClusterState, options: Sequence[Placement]) -> Placement:
    """Of ``options`` (at least one), the one after which the cluster's cost per hour
    over its work per hour is least (ties: the first)."""
    cap = state.capacity
    cost, work = state.cost_per_hour, state.work_per_hour
    best, best_ratio = options[0], math.inf
    for p in options:
        old = state.by_id.get(p.group_id)
        gained = group_work_rate(p.group, cap) - (0.0 if old is None
                                                  else group_work_rate(old, cap))
        ratio = (cost + p.cost_delta_per_hour) / max(work + gained, _EPS)
        if ratio < best_ratio * (1 - 1e-9):
            best, best_ratio = p, ratio
    return best
