"""Translating between the store's groups and the placement engine's (pure over rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from weave_slurm.daemon.records import GroupPlan, GroupRow, JobRow, MemberPlan
from weave_slurm.placement import Capacity, ClusterState, Group, Member

#: Members of a group in these states count for placement (they hold warm state).
_LIVE = frozenset({"PLACED", "RUNNING", "CANCELLING"})


def plan_of(group: Group) -> GroupPlan:
    return GroupPlan(group.rollout_nodes, group.train_nodes,
                     tuple(MemberPlan(int(m.job.job_id), m.rollout_pins)
                           for m in group.members))


def group_model(row: GroupRow, jobs: Mapping[int, JobRow]) -> Group | None:
    """The placement engine's view of a stored group (None if no live member is left)."""
    members = tuple(Member(jobs[m.job_id].plan_profile.with_id(str(m.job_id)), m.rollout_pins)
                    for m in row.plan.members
                    if m.job_id in jobs and jobs[m.job_id].state.value in _LIVE)
    if not members:
        return None
    return Group(row.group_id, members, row.plan.rollout_nodes, row.plan.train_nodes)


def cluster_state(capacity: Capacity, groups: Sequence[GroupRow], jobs: Sequence[JobRow],
                  next_group_id: int) -> ClusterState:
    """The ClusterState placement decides over, rebuilt from the store."""
    by_id = {j.job_id: j for j in jobs}
    models = [group_model(g, by_id) for g in groups if g.state.value in ("FORMING", "ACTIVE")]
    return ClusterState(capacity, tuple(m for m in models if m is not None), next_group_id)


def group_label(instance: str, group_id: int) -> str:
    """The backend's group id: ``<n>`` or ``<instance>.<n>`` (letters, digits, '.', '_')."""
    return f"{instance}.{group_id}" if instance else str(group_id)


def name_prefix(instance: str) -> str:
    """The allocation-name prefix that is this daemon's (``weave-g<instance>.``)."""
    return f"weave-g{instance}." if instance else "weave-g"
