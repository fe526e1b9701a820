"""Re-planning beyond single arrivals: consolidation after a departure, global regroup.

Both move running jobs between groups, which copies their warm state to other nodes
(a pause of the moved job: its state over the intra-pool fabric plus a restart), so
they are offered as separate steps on top of arrival placement, never inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.cluster import ClusterState
from weave_slurm.placement.decision import Policy
from weave_slurm.placement.engine import may_fit

_EPS = 1e-9


def solo_work_rate(state: ClusterState) -> float:
    """Solo-speed jobs the state runs: the sum over jobs of solo time / iteration time."""
    total = 0.0
    for g in state.groups:
        period = g.schedule.expected_period_s
        if period > 0:
            total += sum(m.job.solo_mean_s for m in g.members) / period
    return total


def moved_jobs(before: ClusterState, after: ClusterState) -> tuple[str, ...]:
    """Jobs whose group changed between two states (their warm state must move)."""
    out = []
    for job_id, gid in after.job_group.items():
        old = before.job_group.get(job_id)
        if old is not None and (old != gid or _members(before, old) != _members(after, gid)):
            out.append(job_id)
    return tuple(sorted(out))


def _members(state: ClusterState, gid: int) -> frozenset[str]:
    return frozenset(state.by_id[gid].job_ids)


def consolidated(policy: Policy, state: ClusterState, group_id: int,
                 keep_work: bool = False) -> ClusterState | None:
    """Re-place the members of a group that just shrank into the rest of the cluster.

    Returns the new state when it is strictly cheaper per hour, else None (keep the
    group as it is). With ``keep_work`` (when a slowed job runs and pays longer) the
    cluster's solo-speed work rate must not drop either.
    """
    group = state.by_id.get(group_id)
    if group is None or group.colocated:
        return None
    rest = replace(state, groups=tuple(g for g in state.groups if g.group_id != group_id))
    # Cheaper needs the group's training nodes released, so every member must be able
    # to join some other group: check the O(1) necessary conditions first.
    free_t = state.capacity.train_pool_nodes - rest.train_nodes_used
    for m in group.members:
        if not any(may_fit(g, m.job, state.capacity, free_t) for g in rest.groups):
            return None
    new = place_batch(policy, rest, [m.job for m in group.members]).state
    if len(new.job_group) != len(state.job_group):
        return None  # some member found no place
    if new.cost_per_hour >= state.cost_per_hour - _EPS:
        return None
    if keep_work and solo_work_rate(new) < solo_work_rate(state) * (1 - _EPS):
        return None
    return new


def regrouped(policy: Policy, state: ClusterState, jobs: Sequence[JobProfile]) -> ClusterState:
    """Global re-planning from scratch (the paper's impractical hourly baseline)."""
    fresh = ClusterState(state.capacity, (), state.next_group_id)
    return place_batch(policy, fresh, jobs).state
