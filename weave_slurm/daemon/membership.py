"""Translating between the store's groups and the placement engine's (pure over rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from weave_slurm.daemon.records import GroupPlan, GroupRow, JobRow, MemberPlan
from weave_slurm.errors import ConfigError
from weave_slurm.placement import Capacity, ClusterState, Group, Member, depart
from weave_slurm.slurm.backend import DEFAULT_INSTANCE

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


def plan_without(capacity: Capacity, group: GroupRow, jobs: Sequence[JobRow],
                 next_group_id: int, job_id: int) -> GroupPlan | None:
    """The group's plan once job ``job_id`` has left it (placement's ``depart``: the
    cyclic order re-packed); None if no live member is left."""
    state = cluster_state(capacity, [group], jobs, next_group_id)
    model = state.by_id.get(group.group_id)
    after = depart(state, str(job_id)) if model and str(job_id) in model.job_ids else state
    new = after.by_id.get(group.group_id)
    return plan_of(new) if new is not None else None


def group_label(instance: str, group_id: int) -> str:
    """The backend's group id: ``<n>`` or ``<instance>.<n>`` (letters, digits, '.', '_')."""
    return f"{instance}.{group_id}" if instance else str(group_id)


def name_prefix(instance: str) -> str:
    """The allocation-name prefix of this daemon's allocations (``weave-g<instance>.``), for
    people (``squeue -n``): a daemon without an instance has ``weave-g``, a prefix of every
    instance's names, so ownership is never decided on it (see :func:`instance_tag`)."""
    return f"weave-g{instance}." if instance else "weave-g"


def instance_tag(instance: str) -> str:
    """The tag in this daemon's allocation comments: its ``--instance``, or ``default``.

    With the uid, the tag decides which allocations are this daemon's to adopt or
    release. ``--instance default`` is refused: it would share the unnamed daemon's tag.
    """
    if instance == DEFAULT_INSTANCE:
        raise ConfigError(f"--instance {instance!r} is the tag of a weaved started without "
                          "--instance; pick another name, or leave it out")
    return instance or DEFAULT_INSTANCE
