"""A job's resolved profile: the numbers placement, the simulator and the runtime use.

``profile_job`` prefers measured values from the spec's ``[profile]`` table and falls
back to :mod:`weave_slurm.model.perf` estimates for anything missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import weave_slurm.model.perf as perf
from weave_slurm.config.job import JobSpec
from weave_slurm.config.site import SiteConfig
from weave_slurm.errors import InfeasibleRequest
from weave_slurm.model.charge import NO_CHARGE, Charge, job_charge
from weave_slurm.model.layout import MemberLayout, member_layout


@dataclass(frozen=True, slots=True)
class JobProfile:
    """Per-job numbers in seconds and GiB; ``*_max_s`` are the admission bounds."""

    job_id: str
    slo: float
    rollout_nodes: int
    train_nodes: int
    rollout_max_s: float
    rollout_mean_s: float
    train_max_s: float
    train_mean_s: float
    sync_s: float
    rollout_state_gib: float  # per rollout node
    train_state_gib: float  # per training node
    sync_inter_gib: float = 0.0
    sync_intra_gib: float = 0.0
    colo_iter_s: float = 0.0  # both phases on the training GPUs (co-located baseline)
    colo_nodes: int = 0
    name: str = ""
    user: str = ""
    staleness: int = 0  # rollout of step m may use the weights of step m - 1 - staleness
    # ranks and engines over the nodes above (None: a trace's job, which names no GPUs)
    layout: MemberLayout | None = None
    charge: Charge = NO_CHARGE   # Slurm account and QOS: only equal charges share a group
    # Device memory per GPU (GiB): the peak while the phase runs on it, and what stays
    # there once the member is switched out (docs/model.md "Device memory"); 0: not
    # constrained (a trace's job). colo: both phases on the training GPUs (baseline).
    rollout_gpu_peak_gib: float = 0.0
    rollout_gpu_resident_gib: float = 0.0
    train_gpu_peak_gib: float = 0.0
    train_gpu_resident_gib: float = 0.0
    colo_gpu_peak_gib: float = 0.0
    # Its rollout's width (docs/model.md "Rollout width"): the GPUs its rollout times
    # are for (0: its rollout nodes, whole), the GPUs of one engine replica (a width is
    # a multiple of it) and the weights-bound floor of an admission-bound rollout on
    # any number of GPUs (0: none known). Only a pooled group changes its width.
    rollout_gpus: int = 0
    rollout_replica_gpus: int = 1
    rollout_floor_s: float = 0.0
    # measured: its rollout's seconds on GPU counts (``[profile] rollout_width_s``), which
    # price its width instead of the rule above (the floor then: its widest time)
    rollout_width_s: tuple[tuple[int, float], ...] = ()
    # Runs alone: no other job joins its group and it joins none (weave-sbatch --solo;
    # placement/constraints.py), e.g. to compare its final weights with a grouped run.
    solo: bool = False

    # Derived once (placement asks for them millions of times in a long replay).
    solo_s: float = field(init=False, repr=False, compare=False)
    solo_mean_s: float = field(init=False, repr=False, compare=False)
    budget_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        solo = solo_period(self.rollout_max_s, self.train_max_s, self.sync_s, self.staleness)
        # solo_s: iteration time alone on its own nodes, with the admission bounds;
        # budget_s: the longest admissible iteration (meta-iteration period) under the SLO.
        object.__setattr__(self, "solo_s", solo)
        object.__setattr__(self, "solo_mean_s", solo_period(
            self.rollout_mean_s, self.train_mean_s, self.sync_s, self.staleness))
        object.__setattr__(self, "budget_s", self.slo * solo)

    def with_id(self, job_id: str) -> JobProfile:
        return replace(self, job_id=job_id)

    def base_gpus(self, gpus_per_node: int) -> int:
        """The GPUs its rollout times are for."""
        return self.rollout_gpus or self.rollout_nodes * gpus_per_node

    @property
    def rollout_floor_fraction(self) -> float:
        """Its weights-bound floor over its rollout time (at most 1: no width helps)."""
        return min(1.0, self.rollout_floor_s / self.rollout_max_s) \
            if self.rollout_max_s > 0 else 0.0

    def width_factor(self, gpus: int, gpus_per_node: int) -> float:
        """Its rollout's time on ``gpus`` GPUs over its rollout times
        (:func:`weave_slurm.model.perf.width_factor`)."""
        base = self.base_gpus(gpus_per_node)
        if self.rollout_width_s:
            curve = self.rollout_width_s
            return perf.curve_rollout_s(curve, gpus) / perf.curve_rollout_s(curve, base)
        return perf.width_factor(base, gpus, self.rollout_floor_fraction)


def solo_period(rollout_s: float, train_s: float, sync_s: float, staleness: int = 0) -> float:
    """Iteration time of a job alone on its own nodes.

    Strictly on-policy it is ``rollout + sync + train``. With a window of ``k`` the
    rollout of step ``m`` needs only the weights of step ``m - 1 - k``, so rollout and
    training overlap, and the cycles of the schedule's recurrence give
    ``max(rollout, train, (rollout + sync + train) / (k + 1))``.
    """
    return max(rollout_s, train_s, (rollout_s + sync_s + train_s) / (staleness + 1))


def simple_profile(job_id: str, rollout_s: float, train_s: float, slo: float, *,
                   rollout_nodes: int = 1, train_nodes: int = 1, sync_s: float = 0.0,
                   rollout_mean_s: float | None = None, rollout_state_gib: float = 0.0,
                   train_state_gib: float = 0.0, colo_iter_s: float | None = None,
                   colo_nodes: int | None = None, staleness: int = 0) -> JobProfile:
    """A profile from bare phase times (traces, benchmarks, tests)."""
    return JobProfile(
        job_id=job_id, slo=slo, rollout_nodes=rollout_nodes, train_nodes=train_nodes,
        rollout_max_s=rollout_s,
        rollout_mean_s=rollout_s if rollout_mean_s is None else rollout_mean_s,
        train_max_s=train_s, train_mean_s=train_s, sync_s=sync_s,
        rollout_state_gib=rollout_state_gib, train_state_gib=train_state_gib,
        colo_iter_s=colo_iter_s if colo_iter_s is not None else rollout_s + train_s,
        colo_nodes=colo_nodes if colo_nodes is not None else train_nodes, name=job_id,
        staleness=staleness)


def profile_job(spec: JobSpec, site: SiteConfig, job_id: str | None = None) -> JobProfile:
    """Resolve a spec into a profile; raise InfeasibleRequest if it can never fit."""
    rp, tp = site.rollout, site.train
    layout = member_layout(spec, site)
    rollout_nodes, train_nodes = layout.rollout.nodes, layout.train.nodes
    meas = spec.profile
    est = perf.estimate_rollout(spec, rp.gpu, spec.rollout_gpus, site.model,
                                layout.rollout.engine_gpus)
    if meas.rollout is not None:
        r_max, r_mean = meas.rollout.max_s, meas.rollout.mean_s
    else:
        r_max = est.max_s
        r_mean = est.max_s * site.model.rollout_mean_fraction
    if meas.train is not None:
        t_max, t_mean = meas.train.max_s, meas.train.mean_s
    else:
        t_max = t_mean = perf.estimate_train_s(spec, tp.gpu, spec.train_gpus, site.model)
    w = perf.weights_gib(spec.model.params_b)
    inter = meas.sync_inter_gib if meas.sync_inter_gib is not None else w
    intra = (meas.sync_intra_gib if meas.sync_intra_gib is not None
             else w * (rollout_nodes - 1) / rollout_nodes)
    # per node: its busiest node's share (the engines' GPUs, the ranks' shards)
    r_state = (meas.rollout_state_gib if meas.rollout_state_gib is not None
               else est.state_gib_per_gpu * max(layout.rollout.engines_per_node)
               * layout.rollout.engine_gpus)
    t_state = (meas.train_state_gib if meas.train_state_gib is not None
               else perf.train_state_gib(spec) / layout.train.ranks
               * max(layout.train.ranks_per_node))
    if spec.launch is not None:    # its processes' own store (Ray's), on each node
        r_state += spec.launch.object_store_gib
        t_state += spec.launch.object_store_gib
    colo_est = perf.estimate_rollout(spec, tp.gpu, spec.train_gpus, site.model)
    if meas.colo_iter_s is not None:
        colo = meas.colo_iter_s
    else:
        colo = colo_est.max_s + t_max + 2 * site.model.colo_switch_s
    for role, state, pool in (("rollout", r_state, rp), ("train", t_state, tp)):
        if state > pool.host_mem_gib:
            raise InfeasibleRequest(
                f"{spec.source}: {role} state of {state:.1f} GiB per node exceeds host_mem_gib="
                f"{pool.host_mem_gib:g} of pool '{role}' ({pool.partition}); ask for more "
                f"GPUs per phase ([gpus] {role}) or run on a site with larger nodes")
    r_gpu = _device(spec, "rollout", meas.rollout_gpu_peak_gib, meas.rollout_gpu_resident_gib,
                    perf.rollout_gpu_peak_gib(est), site)
    t_gpu = _device(spec, "train", meas.train_gpu_peak_gib, meas.train_gpu_resident_gib,
                    perf.train_gpu_peak_gib(spec, layout.train.ranks), site)
    # one process, phases taking turns on the training GPUs (docs/model.md)
    colo_gpu = max(t_gpu[0], perf.rollout_gpu_peak_gib(colo_est))
    return JobProfile(
        job_id=job_id or spec.name, slo=spec.slo if spec.slo is not None else site.default_slo,
        rollout_nodes=rollout_nodes, train_nodes=train_nodes,
        rollout_max_s=r_max, rollout_mean_s=r_mean, train_max_s=t_max, train_mean_s=t_mean,
        sync_s=perf.sync_seconds(inter, intra, site.network),
        rollout_state_gib=r_state, train_state_gib=t_state,
        sync_inter_gib=inter, sync_intra_gib=intra, colo_iter_s=colo, colo_nodes=train_nodes,
        name=spec.name, user=spec.user, staleness=spec.staleness, layout=layout,
        charge=job_charge(spec, site.slurm), rollout_gpu_peak_gib=r_gpu[0],
        rollout_gpu_resident_gib=r_gpu[1], train_gpu_peak_gib=t_gpu[0],
        train_gpu_resident_gib=t_gpu[1], colo_gpu_peak_gib=colo_gpu,
        rollout_gpus=spec.rollout_gpus, rollout_replica_gpus=layout.rollout.engine_gpus,
        rollout_floor_s=_floor_s(spec, r_max, layout.rollout.engine_gpus, site),
        rollout_width_s=meas.rollout_width_s, solo=spec.solo)


def _floor_s(spec: JobSpec, rollout_s: float, engine_gpus: int, site: SiteConfig) -> float:
    """The least time its rollout takes on any number of GPUs: its measured curve's
    widest over its own GPUs' (``[profile] rollout_width_s``), else the weights-bound
    estimate (:func:`~weave_slurm.model.perf.decode_floor_s`)."""
    curve = spec.profile.rollout_width_s
    if curve:
        own = perf.curve_rollout_s(curve, spec.rollout_gpus)
        return rollout_s * min(1.0, min(t for _, t in curve) / own)
    return perf.decode_floor_s(spec.model.params_b, spec.rollout.max_response_tokens,
                               engine_gpus, site.rollout.gpu, site.model)


def _device(spec: JobSpec, role: str, peak: float | None, held: float | None,
            estimate: float, site: SiteConfig) -> tuple[float, float]:
    """``(peak, resident)`` per GPU of one role: measured where ``[profile]`` gives them,
    else the estimates (a resident is never above its peak); InfeasibleRequest if the
    peak alone does not fit the pool's GPU."""
    key = f"{role}_gpu_peak_gib"
    source = "measured" if peak is not None else "estimated"
    peak = estimate if peak is None else peak
    held = min(perf.DEVICE_RESIDENT_GIB, peak) if held is None else held
    peak = max(peak, held)
    pool = site.rollout if role == "rollout" else site.train
    if peak > pool.gpu.hbm_gib:
        more = "GPUs per engine ([gpus] engine)" if role == "rollout" else "training GPUs " \
            "([gpus] train)"
        raise InfeasibleRequest(
            f"{spec.source}: job '{spec.name}': {role} peak {key} = {peak:.1f} GiB per GPU "
            f"({source}) exceeds hbm_gib={pool.gpu.hbm_gib:g} of the {pool.gpu.name} GPUs of "
            f"pool '{role}' ({pool.partition}); ask for more {more}")
    return peak, held
