"""Performance, state-size and cost model (pure: no torch, no Slurm)."""

from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import JobProfile, profile_job, simple_profile

__all__ = ["CostRates", "JobProfile", "profile_job", "simple_profile"]
