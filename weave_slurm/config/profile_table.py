"""A job spec's ``[profile]`` table: what an operator measured of the job (docs/model.md).

Every key is optional; :func:`~weave_slurm.model.profile.profile_job` takes a measured
value over the analytic estimate of the same quantity. ``rollout_width_s`` is the
rollout's time on several GPU counts (docs/model.md "Rollout width"): with it a pooled
group's width is priced from the measurement instead of the linear rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.config.reader import TableReader
from weave_slurm.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Durations:
    """A measured phase-duration distribution, in seconds."""

    mean_s: float
    max_s: float
    samples: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class MeasuredProfile:
    """The quantities an operator records (any subset may be given); ``*_gpu_*_gib``
    are per GPU: the peak while the phase runs and what stays resident switched out."""

    rollout: Durations | None = None
    train: Durations | None = None
    rollout_state_gib: float | None = None
    train_state_gib: float | None = None
    sync_inter_gib: float | None = None
    sync_intra_gib: float | None = None
    colo_iter_s: float | None = None
    rollout_gpu_peak_gib: float | None = None
    rollout_gpu_resident_gib: float | None = None
    train_gpu_peak_gib: float | None = None
    train_gpu_resident_gib: float | None = None
    # its rollout's time (s) on each of several GPU counts, the same batch each time
    # (``bench/rollout_width.py`` measures it): ``((gpus, seconds), ...)``, GPUs rising
    rollout_width_s: tuple[tuple[int, float], ...] = ()



def _durations(r: TableReader, name: str) -> Durations | None:
    if not r.has(name):
        r.opt_number(name)  # marks the key as known
        return None
    if not r.is_table(name):  # a plain number is shorthand for mean = max
        value = r.number(name, gt=0)
        return Durations(mean_s=value, max_s=value)
    t = r.table(name)
    assert t is not None
    samples = t.number_list("samples", gt=0) or ()
    mean = t.opt_number("mean", gt=0)
    peak = t.opt_number("max", gt=0)
    if mean is None:
        if not samples:
            raise ConfigError(f"{r.source}: key '{t.key('mean')}' missing: give 'mean' "
                              "(and 'max') or 'samples'")
        mean = sum(samples) / len(samples)
    if peak is None:
        peak = max(samples) if samples else mean
    if peak < mean:
        raise t.fail("max", peak, f"must be >= mean ({mean:g})")
    t.done()
    return Durations(mean_s=mean, max_s=peak, samples=samples)


def read_profile(r: TableReader) -> MeasuredProfile:
    """The spec's ``[profile]`` table (every key optional)."""
    prof = MeasuredProfile(
        rollout=_durations(r, "rollout_s"),
        train=_durations(r, "train_s"),
        rollout_state_gib=r.opt_number("rollout_state_gib", gt=0),
        train_state_gib=r.opt_number("train_state_gib", gt=0),
        sync_inter_gib=r.opt_number("sync_inter_gib", ge=0),
        sync_intra_gib=r.opt_number("sync_intra_gib", ge=0),
        colo_iter_s=r.opt_number("colo_iter_s", gt=0),
        rollout_gpu_peak_gib=r.opt_number("rollout_gpu_peak_gib", gt=0),
        rollout_gpu_resident_gib=r.opt_number("rollout_gpu_resident_gib", ge=0),
        train_gpu_peak_gib=r.opt_number("train_gpu_peak_gib", gt=0),
        train_gpu_resident_gib=r.opt_number("train_gpu_resident_gib", ge=0),
        rollout_width_s=_width_curve(r, "rollout_width_s"),
    )
    for role, peak, held in (
            ("rollout", prof.rollout_gpu_peak_gib, prof.rollout_gpu_resident_gib),
            ("train", prof.train_gpu_peak_gib, prof.train_gpu_resident_gib)):
        if peak is not None and held is not None and held > peak:
            raise r.fail(f"{role}_gpu_resident_gib", held, f"must be <= {role}_gpu_peak_gib "
                         f"({peak:g}): what a member holds switched out is part of its peak")
    r.done()
    return prof


def _width_curve(r: TableReader, name: str) -> tuple[tuple[int, float], ...]:
    """``rollout_width_s = {1 = 40.0, 2 = 21.0, 4 = 12.5}``: seconds by GPU count, at
    least two counts."""
    t = r.table(name, required=False)
    if t is None:
        return ()
    points = []
    for key in t.names():
        if not key.isdigit() or int(key) < 1:
            raise t.fail(key, key, "keys are GPU counts (integers >= 1), e.g. "
                                   "rollout_width_s = {1 = 40.0, 2 = 21.0}")
        points.append((int(key), t.number(key, gt=0)))
    t.done()
    if len(points) < 2:
        raise ConfigError(f"{r.source}: key '{r.key(name)}': give the rollout's time on at "
                          f"least two GPU counts, got {len(points)}")
    return tuple(sorted(points))
