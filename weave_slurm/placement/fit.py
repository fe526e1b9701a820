"""Whether a job can fit at all, and the placements that need no search (pure).

Shared by :mod:`weave_slurm.placement.engine` (node-pinned groups) and
:mod:`weave_slurm.placement.pooled_placement` (pooled groups): the refusal of a job that
can never run on the pools, a new group of its own, and the O(1) necessary conditions
for joining a group (:func:`may_fit`), which prune saturated groups before any schedule.
"""

from __future__ import annotations

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.constraints import may_share
from weave_slurm.placement.decision import Admission, Placement, Refusal
from weave_slurm.placement.group import Group, solo_group, turns_for

_EPS = 1e-9


def refuse_if_never_fits(job: JobProfile, cap: Capacity,
                         colocated: bool = False) -> Refusal | None:
    """A refusal if ``job`` can never run on these pools (``colocated``: on h800 only)."""
    reasons = []
    if not colocated and job.rollout_state_gib > cap.rollout_mem_gib:
        reasons.append(f"rollout state {job.rollout_state_gib:.1f} GiB per node exceeds the "
                       f"rollout nodes' host memory ({cap.rollout_mem_gib:g} GiB)")
    if job.train_state_gib > cap.train_mem_gib:
        reasons.append(f"training state {job.train_state_gib:.1f} GiB per node exceeds the "
                       f"training nodes' host memory ({cap.train_mem_gib:g} GiB)")
    for what, peak, gpu_mem, pool in (
            ("rollout", 0.0 if colocated else job.rollout_gpu_peak_gib,
             cap.rollout_gpu_mem_gib, "rollout"),
            ("training", job.colo_gpu_peak_gib if colocated else job.train_gpu_peak_gib,
             cap.train_gpu_mem_gib, "training")):
        if peak > gpu_mem:
            reasons.append(f"{what} peak {peak:.1f} GiB per GPU"
                           f"{' (co-located)' if colocated else ''} exceeds the {pool} GPUs' "
                           f"memory ({gpu_mem:g} GiB)")
    if not colocated and job.rollout_nodes > cap.rollout_pool_nodes:
        reasons.append(f"needs {job.rollout_nodes} rollout nodes, the pool has "
                       f"{cap.rollout_pool_nodes}")
    train_nodes = (job.colo_nodes or job.train_nodes) if colocated else job.train_nodes
    if train_nodes > cap.train_pool_nodes:
        reasons.append(f"needs {train_nodes} training nodes, the pool has "
                       f"{cap.train_pool_nodes}")
    return Refusal(job.job_id, tuple(reasons), retry=False) if reasons else None


def new_group_placement(state: ClusterState, job: JobProfile) -> Placement | None:
    cap = state.capacity
    if (state.rollout_nodes_used + job.rollout_nodes > cap.rollout_pool_nodes
            or state.train_nodes_used + job.train_nodes > cap.train_pool_nodes):
        return None
    group = solo_group(state.next_group_id, job)
    return Placement(job.job_id, Admission.NEW_GROUP, group,
                     cap.rates.rate(job.rollout_nodes, job.train_nodes),
                     job.rollout_nodes, job.train_nodes)


def capacity_refusal(state: ClusterState, job: JobProfile) -> Refusal:
    cap = state.capacity
    return Refusal(job.job_id, (
        f"no existing group can take it within every member's SLO, host and GPU memory, and a "
        f"new group needs {job.rollout_nodes} rollout + {job.train_nodes} training nodes "
        f"while {cap.rollout_pool_nodes - state.rollout_nodes_used} rollout and "
        f"{cap.train_pool_nodes - state.train_nodes_used} training nodes are free",), retry=True)


def may_fit(group: Group, job: JobProfile, cap: Capacity, free_t: int,
            turns: bool = False) -> bool:
    """Necessary conditions for ``job`` to join ``group``, O(1) per group (``turns``:
    it may take several, :func:`turn_options`)."""
    if group.colocated or group.size >= cap.max_group_size:
        return False
    # with one turn its own budget binds too; with more, only the members' do
    budget = group.min_budget_s if max(turn_options(group, job, turns)) > 1 \
        else min(group.min_budget_s, job.budget_s)
    # its own iteration (in a pool, only its training: a wider pool shortens its rollout)
    if (job.train_max_s if group.pooled else job.solo_s) > group.min_budget_s + _EPS:
        return False
    if group.train_load_s + job.train_max_s > budget + _EPS:
        return False
    if group.train_mem_gib + job.train_state_gib > cap.train_mem_gib + _EPS:
        return False
    if job.train_gpu_peak_gib:   # every member trains on node 0: its GPU 0 takes them all
        held, extra = group.train_gpu_parts
        extra = max(extra, job.train_gpu_peak_gib - job.train_gpu_resident_gib)
        if held + job.train_gpu_resident_gib + extra > cap.train_gpu_mem_gib + _EPS:
            return False
    # last: most groups fail a cheaper test first; one account and QOS per group
    return max(0, job.train_nodes - group.train_nodes) <= free_t and may_share(group, job)


def turn_options(group: Group, job: JobProfile, turns: bool = True) -> tuple[int, ...]:
    """The turns ``job`` may take joining ``group``: as many of its iterations as fit in
    the group's cycle (when ``turns``), or one."""
    k = turns_for(group.cycle_s, job) if turns else 1
    return (k, 1) if k > 1 else (1,)
