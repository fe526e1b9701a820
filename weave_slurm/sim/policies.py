"""How the replay turns trace jobs into placement inputs, and its policy wrappers.

Everything that *decides* is in :mod:`weave_slurm.placement`; this module only adapts:

- :func:`job_profile`: a trace job as a :class:`JobProfile`, with the node shapes of the
  accounting mode (``reference`` charges the baselines two h800 nodes for a 32B job,
  the grouped schedule one; ``consistent`` uses one shape for every policy);
- :class:`SimPolicy`: a placement policy plus what the replay does around it: on a
  departure, *consolidation* (:func:`weave_slurm.placement.consolidate.consolidated`)
  re-places the members of the group that shrank, kept only if it lowers the cost;
- :func:`optimum_rate`: the exact optimum of the concurrent job set (reference
  definition: the optimum grouping of the jobs running between two events).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from weave_slurm.config.site import DEFAULT_GPUS, ModelConfig
from weave_slurm.errors import ConfigError
from weave_slurm.model.perf import decode_floor_s, replica_gpus
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.baselines import make_policy
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.optimum import MAX_JOBS, optimum
from weave_slurm.placement.policy import Policy
from weave_slurm.sim.profiles import DEFAULT_PARAMS_B, JobKind, warm_state_gib
from weave_slurm.sim.traces import TraceJob
from weave_slurm.vocab import member_of

#: Policies `weave simulate` knows; ``optimal`` and ``regroup`` re-plan the whole set.
SIM_POLICIES = ("weave", "weave-online", "weave-live", "isolated", "colocated", "random",
                "most-idle", "optimal", "regroup")
#: Policies whose cost does not depend on grouping (every job on its own nodes).
SOLO_POLICIES = ("isolated", "colocated")


class Accounting(enum.StrEnum):
    """How a replay charges time (docs/simulator.md)."""

    REFERENCE = "reference"  # fixed lifetimes, the reference's node shapes and rates
    CONSISTENT = "consistent"  # fixed work; slowdown stretches life; same rules for all

    @classmethod
    def parse(cls, value: str) -> Accounting:
        return member_of(cls, value, "--accounting {value}: valid choices: {choices}")


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


@dataclass(frozen=True)
class StalenessMix:
    """A fraction of a trace's jobs declared with a staleness window ``k`` (issue 9).

    Which jobs: a deterministic draw per job id and seed, so every policy of a replay
    sees the same jobs bounded-stale.
    """

    fraction: float = 0.0
    k: int = 1
    seed: int = 0

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> StalenessMix:
        try:
            frac_s, _, k_s = spec.partition(":")
            mix = cls(float(frac_s), int(k_s or 1), seed)
        except ValueError:
            mix = cls(-1.0)
        if not 0 <= mix.fraction <= 1 or not 0 <= mix.k <= 8:
            raise ConfigError(f"--staleness-mix {spec!r}: expected FRACTION:K with FRACTION in "
                              "[0, 1] and K in 0-8, e.g. 0.3:1")
        return mix

    def staleness_of(self, job_id: str) -> int:
        if self.fraction <= 0:
            return 0
        digest = hashlib.sha256(f"{self.seed}:{job_id}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        return self.k if draw < self.fraction else 0


def job_profile(job: TraceJob, policy: str, accounting: Accounting,
                rollout_mean_fraction: float = 1.0, staleness: int = 0) -> JobProfile:
    """Placement input for ``job`` (solo times from the trace, SLO filled by the loader)."""
    if job.t_rollout_s is None or job.t_train_s is None or job.slo is None:
        raise ConfigError(f"{job.source_line}: job {job.job_id!r} has no profile or SLO; "
                          f"load the trace with load_trace() to fill them in")
    two = needs_two_nodes(job)
    train_nodes = 2 if two and accounting is Accounting.REFERENCE and policy == "isolated" else 1
    rollout_gib, train_gib = job_state_gib(job)
    colo_r = job.t_rollout_colo_s if job.t_rollout_colo_s is not None else job.t_rollout_s
    colo_t = job.t_train_colo_s if job.t_train_colo_s is not None else job.t_train_s
    p = simple_profile(
        job.job_id, job.t_rollout_s, job.t_train_s, job.slo,
        rollout_nodes=2 if two else 1, train_nodes=train_nodes,
        rollout_mean_s=job.t_rollout_s * rollout_mean_fraction,
        colo_iter_s=colo_r * rollout_mean_fraction + colo_t, colo_nodes=2 if two else 1,
        staleness=staleness, rollout_state_gib=rollout_gib,
        train_state_gib=train_gib / train_nodes)
    replica, floor_s = job_width(job)
    return replace(p, rollout_replica_gpus=replica,
                   rollout_floor_s=p.rollout_max_s if floor_s is None else floor_s)


def job_width(job: TraceJob) -> tuple[int, float | None]:
    """What a pooled group needs of a trace job's rollout width (docs/model.md "Rollout
    width"): the GPUs of its engine replica and its weights-bound floor in seconds, from
    its model size and maximum response length on the reference site's H20s. A job that
    names no kind (bare Philly traces) has no model to scale: one GPU a replica and None,
    no speed-up on more GPUs than its own."""
    kind = None
    if job.kind is not None:
        with contextlib.suppress(ConfigError):
            kind = JobKind.parse(job.kind)
    if kind is None:
        return 1, None
    gpu = DEFAULT_GPUS["h20"]
    tp = replica_gpus(kind.model_params_b, gpu)
    return tp, decode_floor_s(kind.model_params_b, kind.max_response_tokens, tp, gpu,
                              ModelConfig())


def job_state_gib(job: TraceJob) -> tuple[float, float]:
    """Warm state of a trace job per rollout node and in all (GiB), from its model size
    (:func:`weave_slurm.sim.profiles.warm_state_gib`); what a move copies."""
    params = DEFAULT_PARAMS_B
    if job.kind is not None:
        try:
            params = JobKind.parse(job.kind).model_params_b
        except ConfigError:
            params = DEFAULT_PARAMS_B
    return warm_state_gib(params)


def job_work(job: TraceJob, p: JobProfile, accounting: Accounting) -> float:
    """Iterations a job must complete: fixed work in consistent accounting (the trace's
    ``iterations``, else its lifetime at solo speed; inf when it has neither), inf in
    reference accounting (lifetimes are fixed there)."""
    if accounting is Accounting.REFERENCE:
        return math.inf
    if job.iterations is not None:
        return float(job.iterations)
    if job.lifetime_s is None:
        return math.inf
    return job.lifetime_s / p.solo_mean_s


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
    consolidate: bool = False  # charged consolidation after a departure
    replace_recent: bool = False  # recent arrivals re-placed together, charged
    replan: bool = False  # periodic charged re-plan of every group
    # re-plans taken only where weaved can carry every move out: onto nodes the new
    # group holds, or waiting for them while the old group's plan stays the one the job
    # runs (placement.replan.waiting_moves); ``weave-live``: consolidation and the
    # periodic re-plan, and recent arrivals re-placed with each new one (docs/daemon.md
    # "Re-planning running jobs")
    weaved_moves: bool = False
    regroup: bool = False
    optimal: bool = False
    pooling: bool = False  # places with weave's policy, so may pool rollout GPUs
    # (weave-live: each pool held as weaved holds it, rows of GPU shares:
    # sim/live_pools.py)
    # ... and may admit jobs co-located where the capacity says so (weave-live: by
    # weaved's rules, closed co-located groups and re-plans without co-location:
    # sim/live.py)
    colocating: bool = False

    @classmethod
    def make(cls, name: str, seed: int = 0) -> SimPolicy:
        if name not in SIM_POLICIES:
            raise ConfigError(f"unknown policy {name!r}; valid choices: {', '.join(SIM_POLICIES)}")
        base = {"weave-online": "weave", "weave-live": "weave", "optimal": "weave",
                "regroup": "weave"}.get(name, name)
        weave, live = name == "weave", name == "weave-live"
        return cls(name, make_policy(base, seed), consolidate=weave or live,
                   replace_recent=weave or live, replan=weave or live, weaved_moves=live,
                   regroup=name == "regroup", optimal=name == "optimal",
                   pooling=base == "weave", colocating=base == "weave")


def refuse_pooled(names: Sequence[str], gangs: bool) -> None:
    """ConfigError where ``--rollout pooled`` meets a policy that runs as weaved does
    (its moves are weaved's) on a site whose ``[runtime] gangs`` is off: weaved runs
    pooled groups only with gangs on (config/site.py refuses the site otherwise)."""
    live = [n for n in names if SimPolicy.make(n).weaved_moves]
    if live and not gangs:
        raise ConfigError(f"--rollout pooled with --policy {live[0]}: weaved runs pooled "
                          "groups only where the site sets [runtime] gangs = true (this "
                          "site: false); valid: --rollout pinned, or a site with gangs on")


def optimum_rate(jobs: Sequence[JobProfile], cap: Capacity) -> float | None:
    """Cost per hour of the exact optimum grouping, or None when the set is too large."""
    if not jobs:
        return 0.0
    if len(jobs) > MAX_JOBS:
        return None
    return optimum(jobs, cap).cost_per_hour
