"""Re-planning beyond single arrivals: consolidation after a departure, global regroup.

Both move running jobs between groups, which copies their warm state to other nodes
(a pause of the moved job: its state over the intra-pool fabric plus a restart), so
they are offered as separate steps on top of arrival placement, never inside it.
Consolidation is charged for its moves and taken only when it pays
(:mod:`weave_slurm.placement.replan`); ``regrouped`` is the paper's uncharged
baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.fit import may_fit
from weave_slurm.placement.policy import Policy
from weave_slurm.placement.replan import Replan, replace_jobs


def consolidation(policy: Policy, state: ClusterState, group_id: int,
                  remaining_s: Mapping[str, float] | None = None) -> Replan | None:
    """Re-place the members of a group that just shrank into the rest of the cluster.

    Taken only when it pays once its moves are charged (``placement.moves.pays``: no
    dearer per hour, cheaper per unit of work after the paused jobs' lost work), so it
    never loses in either accounting; None keeps the group as it is.
    """
    group = state.by_id.get(group_id)
    if group is None or group.colocated:   # a co-located group does not shrink
        return None
    rest = replace(state, groups=tuple(g for g in state.groups if g.group_id != group_id))
    # Only worth searching if some member could join another group at all.
    free_t = state.capacity.train_pool_nodes - rest.train_nodes_used
    if not any(may_fit(g, m.job, state.capacity, free_t)
               for m in group.members for g in rest.groups):
        return None
    return replace_jobs(policy, state, group.job_ids, remaining_s)


def regrouped(policy: Policy, state: ClusterState, jobs: Sequence[JobProfile]) -> ClusterState:
    """Global re-planning from scratch (the paper's impractical hourly baseline)."""
    fresh = ClusterState(state.capacity, (), state.next_group_id)
    return place_batch(policy, fresh, jobs).state
