"""A placement policy: what the engine, the baselines and the simulator's policies are.

Apart from ``placement/decision.py`` (what a policy returns) because it names the
cluster state, which itself names a decision's ``Placement``."""

from __future__ import annotations

from typing import Protocol

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Decision


class Policy(Protocol):
    """A placement policy: a pure function of (cluster state, arriving job)."""

    name: str

    def place(self, state: ClusterState, job: JobProfile) -> Decision: ...
