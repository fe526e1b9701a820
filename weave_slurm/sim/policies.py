"""How the replay turns trace jobs into placement inputs, and its policy wrappers.

Everything that *decides* is in :mod:`weave_slurm.placement`; this module only adapts:

- :func:`job_profile`: a trace job as a :class:`JobProfile`, with the node shapes of the
  accounting mode (``reference`` charges the baselines two h800 nodes for a 32B job,
  the grouped schedule one; ``consistent`` uses one shape for every policy);
- :class:`SimPolicy`: a placement policy plus what the replay does around it: on a
  departure, *consolidation* re-places the members of the group that shrank with the same
  ``place_batch`` the daemon uses, and keeps the result only if it lowers the cost;
- :func:`optimum_rate`: the exact optimum of the concurrent job set (reference
  definition: the optimum grouping of the jobs running between two events).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.baselines import make_policy
from weave_slurm.placement.cluster import Capacity, ClusterState
from weave_slurm.placement.decision import Policy
from weave_slurm.placement.optimum import MAX_JOBS, optimum
from weave_slurm.sim.traces import TraceJob

#: Policies `weave simulate` knows; ``optimal`` and ``regroup`` re-plan the whole set.
SIM_POLICIES = ("weave", "weave-online", "isolated", "colocated", "random", "most-idle",
                "optimal", "regroup")
#: Policies whose cost does not depend on grouping (every job on its own nodes).
SOLO_POLICIES = ("isolated", "colocated")


class Accounting(enum.StrEnum):
    """How a replay charges time (docs/simulator.md)."""

    REFERENCE = "reference"  # fixed lifetimes, the reference's node shapes and rates
    CONSISTENT = "consistent"  # fixed work; slowdown stretches life; same rules for all

    @classmethod
    def parse(cls, value: str) -> Accounting:
        for member in cls:
            if member.value == value:
                return member
        raise ConfigError(f"--accounting {value!r}: valid choices: "
                          f"{', '.join(m.value for m in cls)}")


def parse_policies(spec: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in spec.split(",") if p.strip())
    bad = [p for p in names if p not in SIM_POLICIES]
    if bad or not names:
        raise ConfigError(f"--policy {spec!r}: unknown {bad or 'empty list'}; valid choices: "
                          f"{', '.join(SIM_POLICIES)}")
    return names


def needs_two_nodes(job: TraceJob) -> bool:
    """The reference gives a 32B job two rollout nodes (``double_rollout_resource``)."""
    return job.kind is not None and job.kind.startswith("32B")


def job_profile(job: TraceJob, policy: str, accounting: Accounting,
                rollout_mean_fraction: float = 1.0) -> JobProfile:
    """Placement input for ``job`` (solo times from the trace, SLO filled by the loader)."""
    if job.t_rollout_s is None or job.t_train_s is None or job.slo is None:
        raise ConfigError(f"{job.source_line}: job {job.job_id!r} has no profile or SLO; "
                          f"load the trace with load_trace() to fill them in")
    two = needs_two_nodes(job)
    train_nodes = 2 if two and accounting is Accounting.REFERENCE and policy == "isolated" else 1
    colo_r = job.t_rollout_colo_s if job.t_rollout_colo_s is not None else job.t_rollout_s
    colo_t = job.t_train_colo_s if job.t_train_colo_s is not None else job.t_train_s
    return simple_profile(
        job.job_id, job.t_rollout_s, job.t_train_s, job.slo,
        rollout_nodes=2 if two else 1, train_nodes=train_nodes,
        rollout_mean_s=job.t_rollout_s * rollout_mean_fraction,
        colo_iter_s=colo_r * rollout_mean_fraction + colo_t, colo_nodes=2 if two else 1)


def scale_profile(p: JobProfile, rollout_factor: float, train_factor: float) -> JobProfile:
    """A profile whose phase times drifted by the given factors."""
    return replace(p, rollout_max_s=p.rollout_max_s * rollout_factor,
                   rollout_mean_s=p.rollout_mean_s * rollout_factor,
                   train_max_s=p.train_max_s * train_factor,
                   train_mean_s=p.train_mean_s * train_factor,
                   colo_iter_s=p.colo_iter_s * (rollout_factor + train_factor) / 2)


@dataclass
class SimPolicy:
    """A placement policy as the replay drives it."""

    name: str
    placement: Policy
    consolidate: bool = False
    regroup: bool = False
    optimal: bool = False

    @classmethod
    def make(cls, name: str, seed: int = 0) -> SimPolicy:
        if name not in SIM_POLICIES:
            raise ConfigError(f"unknown policy {name!r}; valid choices: {', '.join(SIM_POLICIES)}")
        base = {"weave-online": "weave", "optimal": "weave", "regroup": "weave"}.get(name, name)
        return cls(name, make_policy(base, seed), consolidate=name == "weave",
                   regroup=name == "regroup", optimal=name == "optimal")


def solo_work_rate(state: ClusterState) -> float:
    """Solo-speed jobs the state runs: sum over jobs of solo time / iteration time."""
    total = 0.0
    for g in state.groups:
        period = g.schedule.expected_period_s
        if period > 0:
            total += sum(m.job.solo_mean_s for m in g.members) / period
    return total


def consolidated(policy: Policy, state: ClusterState, group_id: int,
                 keep_work: bool = False) -> ClusterState | None:
    """Re-place the members of a group that just shrank into the rest of the cluster.

    Returns the new state when it is strictly cheaper per hour, else None. With
    ``keep_work`` (consistent accounting, where a slowed job runs and pays longer) the
    cluster's solo-speed work rate must not drop either; in reference accounting
    lifetimes are fixed, so any slowdown within the SLOs is free. Each moved member's
    warm state is copied to its new group's nodes (counted as a migration).
    """
    group = state.by_id.get(group_id)
    if group is None or group.colocated:
        return None
    rest = replace(state, groups=tuple(g for g in state.groups if g.group_id != group_id))
    result = place_batch(policy, rest, [m.job for m in group.members])
    new = result.state
    if len(new.job_group) != len(state.job_group):
        return None  # some member found no place: keep the group as it is
    if new.cost_per_hour >= state.cost_per_hour - 1e-9:
        return None
    if keep_work and solo_work_rate(new) < solo_work_rate(state) * (1 - 1e-9):
        return None
    return new


def regrouped(policy: Policy, state: ClusterState, jobs: Sequence[JobProfile]) -> ClusterState:
    """Global re-planning from scratch (the paper's impractical hourly baseline)."""
    fresh = ClusterState(state.capacity, (), state.next_group_id)
    result = place_batch(policy, fresh, jobs)
    return result.state


def optimum_rate(jobs: Sequence[JobProfile], cap: Capacity) -> float | None:
    """Cost per hour of the exact optimum grouping, or None when the set is too large."""
    if not jobs:
        return 0.0
    if len(jobs) > MAX_JOBS:
        return None
    return optimum(jobs, cap).cost_per_hour
