"""What a placement policy returns: a placement or a refusal with reasons
(the policy itself: ``placement/policy.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from weave_slurm.placement.group import Group


class Admission(StrEnum):
    """How an arrival was admitted (the paper's three cases, and co-location)."""

    DIRECT = "direct"  # packed into an existing group's idle slots
    SCALE_ROLLOUT = "scale_rollout"  # joined a group that grew its rollout nodes
    NEW_GROUP = "new_group"  # provisioned in isolation
    COLOCATED = "colocated"  # rollout on its own training nodes (docs/placement.md)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    admission: Admission
    group: Group  # the group as it will be after the arrival
    cost_delta_per_hour: float
    added_rollout_nodes: float  # a pooled group's GPUs in node shares
    added_train_nodes: int

    @property
    def group_id(self) -> int:
        return self.group.group_id


@dataclass(frozen=True, slots=True)
class Refusal:
    """No placement now. ``retry`` is True when capacity, not the request, is the problem."""

    job_id: str
    reasons: tuple[str, ...]
    retry: bool

    def message(self) -> str:
        return f"job {self.job_id} not placed: " + "; ".join(self.reasons)


Decision = Placement | Refusal
