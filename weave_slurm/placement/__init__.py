"""Group model, cyclic schedule, inter-group placement, baselines and optimum (pure).

Nothing here has side effects: no Slurm, no torch, no clock. The simulator and the
live daemon call these same functions.
"""

from weave_slurm.placement.admission import BatchResult, place_batch
from weave_slurm.placement.baselines import POLICIES, make_policy
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.decision import Admission, Decision, Placement, Refusal
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.group import Group, GroupSchedule, Member
from weave_slurm.placement.policy import Policy

__all__ = ["POLICIES", "Admission", "BatchResult", "Capacity", "ClusterState", "Decision",
           "Group", "GroupSchedule", "Member", "Placement", "Policy", "Refusal", "WeavePolicy",
           "apply", "depart", "make_policy", "place_batch"]
