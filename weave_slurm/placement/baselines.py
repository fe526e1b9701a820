"""Baseline policies behind the same interface as :class:`WeavePolicy`."""

from __future__ import annotations

import hashlib
import random

from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Admission, Decision, Placement
from weave_slurm.placement.engine import WeavePolicy, group_placements
from weave_slurm.placement.fit import (
    capacity_refusal,
    new_group_placement,
    refuse_if_never_fits,
)
from weave_slurm.placement.group import colocated_group
from weave_slurm.placement.policy import Policy


class IsolatedPolicy:
    """Isolated disaggregation: every job gets its own rollout and training nodes."""

    name = "isolated"

    def place(self, state: ClusterState, job: JobProfile) -> Decision:
        never = refuse_if_never_fits(job, state.capacity)
        if never is not None:
            return never
        fresh = new_group_placement(state, job)
        return fresh if fresh is not None else capacity_refusal(state, job)


class ColocatedPolicy:
    """The veRL way: both phases time-share the job's own training (h800) nodes."""

    name = "colocated"

    def place(self, state: ClusterState, job: JobProfile) -> Decision:
        cap = state.capacity
        nodes = job.colo_nodes or job.train_nodes
        never = refuse_if_never_fits(job, cap, colocated=True)
        if never is not None:
            return never
        if state.train_nodes_used + nodes > cap.train_pool_nodes:
            return capacity_refusal(state, job)
        group = colocated_group(state.next_group_id, job)
        return Placement(job.job_id, Admission.NEW_GROUP, group, cap.rates.rate(0, nodes),
                         0, nodes)


class RandomPolicy:
    """A uniformly random feasible option (existing groups or a new one), seeded."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def place(self, state: ClusterState, job: JobProfile) -> Decision:
        never = refuse_if_never_fits(job, state.capacity)
        if never is not None:
            return never
        options: list[Placement] = list(group_placements(state, job))
        fresh = new_group_placement(state, job)
        if fresh is not None:
            options.append(fresh)
        if not options:
            return capacity_refusal(state, job)
        digest = hashlib.sha256(f"{self.seed}:{job.job_id}".encode()).digest()
        return random.Random(digest).choice(options)


class MostIdlePolicy:
    """Direct packing into the most idle group, else scaling it, else a new group."""

    name = "most-idle"

    def place(self, state: ClusterState, job: JobProfile) -> Decision:
        never = refuse_if_never_fits(job, state.capacity)
        if never is not None:
            return never
        best: Placement | None = None
        best_key: tuple[int, float, int] = (2, 0.0, 0)
        for cand in group_placements(state, job):
            old = state.by_id[cand.group_id].schedule
            idle = 2.0 - old.rollout_busy - old.train_busy
            kind = 0 if cand.admission is Admission.DIRECT else 1
            key = (kind, -idle, cand.group_id)
            if key < best_key:
                best, best_key = cand, key
        if best is None:
            best = new_group_placement(state, job)
        return best if best is not None else capacity_refusal(state, job)


POLICIES = ("weave", "isolated", "colocated", "random", "most-idle")


def make_policy(name: str, seed: int = 0) -> Policy:
    if name == "weave":
        return WeavePolicy()
    if name == "isolated":
        return IsolatedPolicy()
    if name == "colocated":
        return ColocatedPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "most-idle":
        return MostIdlePolicy()
    raise ConfigError(f"unknown policy '{name}'; valid choices: {', '.join(POLICIES)}")
