"""Load a trace of any supported format and complete what the file leaves out.

``load_trace`` resolves the path (a bare name like ``wild`` or ``philly_0_10000_20``
means the packaged reference copy), detects the format from the content unless one is
forced, reads it, then fills every job's missing pieces deterministically:

- profile: by ``kind`` from ``profile.json`` (both ``disagg`` and ``colo``); a job with
  neither kind, profile nor job spec draws one from :class:`SyntheticProfileDistribution`
  (bare Philly traces);
- SLO: drawn from the SLO distribution, one draw per job lacking one, in arrival order.

Randomness: SLOs come from ``random.Random(seed)``, synthetic profiles from a second
stream ``random.Random(f"weave-profile:{seed}")``, so adding profiles never shifts SLOs.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from weave_slurm.data import reference_dir
from weave_slurm.errors import ConfigError
from weave_slurm.sim.profiles import (
    ProfileTable,
    SyntheticProfileDistribution,
    load_profile_table,
)
from weave_slurm.sim.reference_traces import (
    detect_line_format,
    parse_event_lines,
    write_event_lines,
)
from weave_slurm.sim.slo import REFERENCE_SLO_SEED, SloDistribution, reference_slo_distribution
from weave_slurm.sim.toml_traces import parse_toml_trace, write_toml_trace
from weave_slurm.sim.traces import Trace, TraceFormat, TraceJob

DEFAULT_TRACE = "wild"


def resolve_trace_path(name: str | Path | None) -> Path:
    """A path as given if it exists, else the packaged reference file of that name
    (``wild`` -> ``wild.trace``); ConfigError listing the packaged names otherwise."""
    if name is None:
        name = DEFAULT_TRACE
    path = Path(name)
    if path.exists():
        return path
    packaged = reference_dir()
    for candidate in (packaged / path.name, packaged / f"{path.name}.trace"):
        if candidate.is_file():
            return candidate
    names = sorted(p.stem for p in packaged.glob("*.trace"))
    raise ConfigError(f"trace {str(name)!r} not found; give a path or one of the packaged "
                      f"traces: {', '.join(names)}")


def detect_format(path: Path, text: str) -> TraceFormat:
    """Format of a trace from its content (TOML: a ``.toml`` suffix or ``key = value``
    / ``[[job]]`` lines; otherwise the field count of the first arrival line)."""
    if path.suffix == ".toml":
        return TraceFormat.TOML
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("[") or ("=" in stripped and "," not in stripped):
            return TraceFormat.TOML
        break
    fmt = detect_line_format(text.splitlines())
    if fmt is None:
        raise ConfigError(f"{path}: cannot tell the trace format (no arrival line with 3, 4 "
                          f"or 6 fields); force one with --format "
                          f"{{{', '.join(f.value for f in TraceFormat)}}}")
    return fmt


def read_trace_file(path: Path, fmt: TraceFormat | None = None) -> Trace:
    """Parse a trace file without filling anything in."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc}") from None
    fmt = fmt or detect_format(path, text)
    if fmt is TraceFormat.TOML:
        return parse_toml_trace(text, path)
    return parse_event_lines(text.splitlines(), fmt, str(path))


def load_trace(name: str | Path | None = None, *, fmt: TraceFormat | str | None = None,
               slo: SloDistribution | str | None = None, seed: int = REFERENCE_SLO_SEED,
               profiles: ProfileTable | None = None,
               synthetic: SyntheticProfileDistribution | None = None) -> Trace:
    """Read a trace and fill in missing profiles and SLOs (see module docstring)."""
    path = resolve_trace_path(name)
    if isinstance(fmt, str):
        fmt = TraceFormat.parse(fmt)
    if isinstance(slo, str):
        slo = SloDistribution.parse(slo)
    trace = read_trace_file(path, fmt)
    return complete_trace(trace, slo=slo or reference_slo_distribution(), seed=seed,
                          profiles=profiles, synthetic=synthetic)


def complete_trace(trace: Trace, *, slo: SloDistribution, seed: int,
                   profiles: ProfileTable | None = None,
                   synthetic: SyntheticProfileDistribution | None = None) -> Trace:
    """Fill missing profiles and SLOs of ``trace`` (deterministic for a seed)."""
    if profiles is None and any(j.kind is not None for j in trace.jobs):
        profiles = load_profile_table()
    synthetic = synthetic or SyntheticProfileDistribution()
    slo_rng = random.Random(seed)
    profile_rng = random.Random(f"weave-profile:{seed}")
    jobs = []
    for job in trace.jobs:
        job = _fill_profile(job, trace.source, profiles, synthetic, profile_rng)
        if job.slo is None:
            job = replace(job, slo=slo.draw(slo_rng))
        jobs.append(job)
    return Trace(tuple(jobs), trace.events, trace.start_time, trace.source)


def _fill_profile(job: TraceJob, source: str, profiles: ProfileTable | None,
                  synthetic: SyntheticProfileDistribution, rng: random.Random) -> TraceJob:
    if job.kind is not None and profiles is not None:
        disagg, colo = profiles.lookup(job.kind, "disagg"), profiles.lookup(job.kind, "colo")
        if disagg is None or colo is None:
            raise ConfigError(f"{source}:{job.source_line}: job {job.job_id!r} kind "
                              f"{job.kind!r} not in {profiles.source}; valid: "
                              f"{', '.join(profiles.kinds)}")
        if not job.has_profile:
            job = replace(job, t_rollout_s=disagg.rollout_s, t_train_s=disagg.train_s)
        if job.t_rollout_colo_s is None:
            job = replace(job, t_rollout_colo_s=colo.rollout_s, t_train_colo_s=colo.train_s)
        return job
    if not job.has_profile and job.spec_path is None:
        drawn = synthetic.draw(rng)
        job = replace(job, t_rollout_s=drawn.rollout_s, t_train_s=drawn.train_s)
    return job


def save_trace(trace: Trace, path: Path, fmt: TraceFormat | str = TraceFormat.TOML) -> None:
    """Write ``trace`` in ``fmt`` (``toml`` keeps everything; the line formats keep what
    their columns hold, with times rounded to whole seconds)."""
    if isinstance(fmt, str):
        fmt = TraceFormat.parse(fmt)
    try:
        if fmt is TraceFormat.TOML:
            write_toml_trace(trace, path)
        else:
            write_event_lines(trace, path, fmt)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write trace: {exc.strerror}") from None
