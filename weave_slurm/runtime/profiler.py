"""Live profiling: the four quantities of each member, measured while the group runs.

Per member: rollout and training durations (distributions), warm-state bytes (rollout
side = its weights segment, training side = its state segment) and sync bytes (weights
train -> rollout, trajectories rollout -> train). :meth:`LiveProfiler.snapshot` is the
read API (the daemon's status and later placement decisions read it); a member whose
measured median drifts from its declared duration by more than ``drift_tolerance`` is
flagged, and its live slowdown (mean iteration time in the group over its solo
iteration time, estimated from its own measured phases) is compared with its SLO.
:func:`planning_profile` turns a snapshot into the profile that later placement
decisions use (the daemon stores it next to the declared one).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from weave_slurm.model.profile import JobProfile
from weave_slurm.runtime.group import DeclaredProfile
from weave_slurm.vocab import Phase


@dataclass
class _Series:
    durations_s: dict[Phase, list[float]] = field(default_factory=dict)
    iteration_ends_s: list[float] = field(default_factory=list)
    rollout_state_bytes: int = 0
    train_state_bytes: int = 0
    sync_bytes: dict[str, int] = field(default_factory=dict)
    # per phase kind: the largest device peak and switched-out residue a worker reported
    device_peak: dict[Phase, int] = field(default_factory=dict)
    device_resident: dict[Phase, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberProfile:
    """What the runtime measured for one member (a snapshot)."""

    job_id: str
    rollout_s: tuple[float, ...]
    train_s: tuple[float, ...]
    sync_s: tuple[float, ...]
    rollout_state_bytes: int
    train_state_bytes: int
    sync_bytes: dict[str, int]
    solo_iteration_s: float | None
    group_iteration_s: float | None
    slowdown: float | None
    slo: float | None
    drift: tuple[str, ...]
    # bytes per GPU (hosted phases on a device; 0: none reported)
    rollout_gpu_peak_bytes: int = 0
    rollout_gpu_resident_bytes: int = 0
    train_gpu_peak_bytes: int = 0
    train_gpu_resident_bytes: int = 0

    @property
    def slo_ok(self) -> bool | None:
        if self.slowdown is None or self.slo is None:
            return None
        return self.slowdown <= self.slo

    def to_json(self) -> dict[str, object]:
        return {"job": self.job_id, "rollout_s": list(self.rollout_s),
                "train_s": list(self.train_s), "sync_s": list(self.sync_s),
                "rollout_state_bytes": self.rollout_state_bytes,
                "train_state_bytes": self.train_state_bytes, "sync_bytes": self.sync_bytes,
                "solo_iteration_s": self.solo_iteration_s,
                "group_iteration_s": self.group_iteration_s, "slowdown": self.slowdown,
                "slo": self.slo, "slo_ok": self.slo_ok, "drift": list(self.drift),
                "gpu_bytes": {"rollout_peak": self.rollout_gpu_peak_bytes,
                              "rollout_resident": self.rollout_gpu_resident_bytes,
                              "train_peak": self.train_gpu_peak_bytes,
                              "train_resident": self.train_gpu_resident_bytes}}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class LiveProfiler:
    """Accumulates measurements; ``snapshot`` gives frozen :class:`MemberProfile` values."""

    def __init__(self, drift_tolerance: float = 0.5, min_samples: int = 3) -> None:
        self.drift_tolerance = drift_tolerance
        self.min_samples = min_samples
        self._series: dict[str, _Series] = {}
        self._declared: dict[str, DeclaredProfile] = {}

    def track(self, job_id: str, declared: DeclaredProfile) -> None:
        self._series.setdefault(job_id, _Series())
        self._declared[job_id] = declared

    def forget(self, job_id: str) -> None:
        self._series.pop(job_id, None)
        self._declared.pop(job_id, None)

    def phase(self, job_id: str, kind: Phase, duration_s: float) -> None:
        self._series[job_id].durations_s.setdefault(kind, []).append(duration_s)

    def iteration_end(self, job_id: str, now_s: float) -> None:
        self._series[job_id].iteration_ends_s.append(now_s)

    def state_bytes(self, job_id: str, *, rollout: int | None = None,
                    train: int | None = None) -> None:
        series = self._series[job_id]
        if rollout is not None:
            series.rollout_state_bytes = rollout
        if train is not None:
            series.train_state_bytes = train

    def device(self, job_id: str, kind: Phase, result: Mapping[str, Any]) -> None:
        """A phase's device figures (``device_peak_bytes``, ``device_resident_bytes``
        in a hosted phase's result): the largest seen of each is kept."""
        series = self._series.get(job_id)
        if series is None:
            return
        for key, table in (("device_peak_bytes", series.device_peak),
                           ("device_resident_bytes", series.device_resident)):
            value = result.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                table[kind] = max(table.get(kind, 0), value)

    def sync(self, job_id: str, what: str, nbytes: int) -> None:
        bytes_ = self._series[job_id].sync_bytes
        bytes_[what] = bytes_.get(what, 0) + nbytes

    def durations(self, job_id: str, kind: Phase) -> list[float]:
        series = self._series.get(job_id)
        return list(series.durations_s.get(kind, [])) if series else []

    def snapshot(self) -> dict[str, MemberProfile]:
        return {job_id: self._one(job_id, s) for job_id, s in self._series.items()}

    def _one(self, job_id: str, s: _Series) -> MemberProfile:
        declared = self._declared.get(job_id, DeclaredProfile())
        roll = s.durations_s.get(Phase.ROLLOUT, [])
        train = s.durations_s.get(Phase.TRAIN, [])
        sync = s.durations_s.get(Phase.SYNC, [])
        solo = None
        if roll and train:
            solo = (statistics.mean(roll) + statistics.mean(train)
                    + (statistics.mean(sync) if sync else 0.0))
        ends = s.iteration_ends_s
        group = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) >= 2 else None
        slowdown = group / solo if group is not None and solo else None
        drift = []
        for name, xs, want in (("rollout", roll, declared.rollout_s),
                               ("train", train, declared.train_s)):
            med = _median(xs)
            if want and med is not None and len(xs) >= self.min_samples \
                    and abs(med - want) > self.drift_tolerance * want:
                drift.append(f"{name}: measured median {med:.3f} s vs declared {want:.3f} s")
        return MemberProfile(job_id, tuple(roll), tuple(train), tuple(sync),
                             s.rollout_state_bytes, s.train_state_bytes, dict(s.sync_bytes),
                             solo, group, slowdown, declared.slo, tuple(drift),
                             s.device_peak.get(Phase.ROLLOUT, 0),
                             s.device_resident.get(Phase.ROLLOUT, 0),
                             s.device_peak.get(Phase.TRAIN, 0),
                             s.device_resident.get(Phase.TRAIN, 0))


def planning_profile(current: JobProfile, declared: JobProfile, measured: MemberProfile, *,
                     min_samples: int = 3, window: int = 20,
                     tolerance: float = 0.1) -> JobProfile | None:
    """The profile later placement decisions should use, from what the runtime measured.

    ``declared`` is the job's profile at submission (its admission headroom: the ratio of
    its worst-case to mean phase time is kept, because a few measured iterations rarely
    see the longest rollout); ``current`` is what placement uses now. Means come from the
    last ``window`` samples (a drifting job is followed), state sizes from the measured
    segment bytes. None until both phases have ``min_samples`` samples, or when no
    quantity differs from ``current`` by more than ``tolerance`` (relative): placement is
    not re-fed with noise.
    """
    roll, train = measured.rollout_s[-window:], measured.train_s[-window:]
    if len(roll) < min_samples or len(train) < min_samples:
        return None

    def bound(xs: tuple[float, ...], mean_s: float, max_s: float) -> tuple[float, float]:
        mean = statistics.fmean(xs)
        headroom = max_s / mean_s if mean_s > 0 else 1.0
        return mean, max(max(xs), mean * max(1.0, headroom))

    roll_mean, roll_max = bound(roll, declared.rollout_mean_s, declared.rollout_max_s)
    train_mean, train_max = bound(train, declared.train_mean_s, declared.train_max_s)
    sync = statistics.fmean(measured.sync_s[-window:]) if measured.sync_s else current.sync_s
    gib = float(1 << 30)
    roll_gib = measured.rollout_state_bytes / gib or current.rollout_state_gib
    train_gib = measured.train_state_bytes / gib or current.train_state_gib
    # device figures per GPU as the workers measured them (a resident within its peak)
    r_peak = measured.rollout_gpu_peak_bytes / gib or current.rollout_gpu_peak_gib
    r_held = measured.rollout_gpu_resident_bytes / gib or current.rollout_gpu_resident_gib
    t_peak = measured.train_gpu_peak_bytes / gib or current.train_gpu_peak_gib
    t_held = measured.train_gpu_resident_bytes / gib or current.train_gpu_resident_gib
    new = replace(current, rollout_mean_s=roll_mean, rollout_max_s=roll_max,
                  train_mean_s=train_mean, train_max_s=train_max, sync_s=sync,
                  rollout_state_gib=roll_gib, train_state_gib=train_gib,
                  rollout_gpu_peak_gib=max(r_peak, r_held), rollout_gpu_resident_gib=r_held,
                  train_gpu_peak_gib=max(t_peak, t_held), train_gpu_resident_gib=t_held)

    def moved(a: float, b: float) -> bool:
        return abs(a - b) > tolerance * max(abs(b), 1e-9)

    pairs = ((new.rollout_max_s, current.rollout_max_s), (new.train_max_s, current.train_max_s),
             (new.rollout_mean_s, current.rollout_mean_s),
             (new.train_mean_s, current.train_mean_s), (new.sync_s, current.sync_s),
             (new.rollout_state_gib, current.rollout_state_gib),
             (new.train_state_gib, current.train_state_gib),
             (new.rollout_gpu_peak_gib, current.rollout_gpu_peak_gib),
             (new.rollout_gpu_resident_gib, current.rollout_gpu_resident_gib),
             (new.train_gpu_peak_gib, current.train_gpu_peak_gib),
             (new.train_gpu_resident_gib, current.train_gpu_resident_gib))
    return new if any(moved(a, b) for a, b in pairs) else None
