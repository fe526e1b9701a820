"""weave-slurm's own trace format: a TOML file listing jobs.

```toml
version = 1                          # required
source = "nightly mix"               # optional label
start_time = 2025-07-30T15:33:33     # optional wall-clock origin (TOML local datetime)

[[job]]
id = "job0"                          # required, unique
arrival_s = 0.0                      # required, seconds from the trace start, >= 0
lifetime_s = 7200.0                  # optional: departs at arrival_s + lifetime_s
# iterations = 100                   # optional instead: departs after this many iterations
kind = "14B_8k"                      # optional: profile from profile.json by kind
t_rollout_s = 238.6                  # optional inline solo profile (both or neither)
t_train_s = 197.4
# t_rollout_colo_s / t_train_colo_s  # optional co-located profile (both or neither)
slo = 1.5                            # optional; drawn from the SLO distribution if absent
spec = "jobs/grpo.toml"              # optional job-spec path, relative to this file
```

Without ``lifetime_s`` and ``iterations`` a job runs to the end of the replay. Unknown
keys are errors; every error names the file and the line of the job's ``[[job]]``.
"""

from __future__ import annotations

import math
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError
from weave_slurm.sim.traces import Trace, TraceJob

FORMAT_VERSION = 1
TOP_KEYS = frozenset({"version", "source", "start_time", "job"})
JOB_KEYS = frozenset({"id", "arrival_s", "lifetime_s", "iterations", "kind", "t_rollout_s",
                      "t_train_s", "t_rollout_colo_s", "t_train_colo_s", "slo", "spec"})


def _job_header_lines(text: str) -> list[int]:
    lines = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.split("#", 1)[0].strip().replace(" ", "") == "[[job]]":
            lines.append(lineno)
    return lines


def read_toml_trace(path: Path) -> Trace:
    """Read our TOML trace; profiles and SLOs it lacks stay None for the loader."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc.strerror}") from None
    return parse_toml_trace(text, path)


def parse_toml_trace(text: str, path: Path) -> Trace:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {unknown}; valid: "
                          f"{sorted(TOP_KEYS)}")
    if raw.get("version") != FORMAT_VERSION:
        raise ConfigError(f"{path}: version = {raw.get('version')!r}; expected "
                          f"version = {FORMAT_VERSION}")
    start = raw.get("start_time")
    if start is not None and not isinstance(start, datetime):
        raise ConfigError(f"{path}: start_time = {start!r}; expected a TOML datetime like "
                          f"2025-07-30T15:33:33")
    entries = raw.get("job", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: no [[job]] tables; expected at least one")
    headers = _job_header_lines(text)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        line = headers[index] if index < len(headers) else None
        where = f"{path}:{line}" if line is not None else f"{path}: job[{index}]"
        job = _read_job(entry, where, line if line is not None else index, path.parent)
        if job.job_id in seen:
            raise ConfigError(f"{where}: duplicate job id {job.job_id!r} (first on line "
                              f"{seen[job.job_id]}); ids must be unique")
        seen[job.job_id] = line if line is not None else index
        jobs.append(job)
    source = raw.get("source", str(path))
    return Trace.from_jobs(jobs, start_time=start, source=str(source))


def _read_job(entry: Any, where: str, line: int, base: Path) -> TraceJob:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: [[job]] must be a table")
    unknown = sorted(set(entry) - JOB_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid: {sorted(JOB_KEYS)}")
    job_id = entry.get("id")
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"{where}: id = {job_id!r}; expected a non-empty string")
    where = f"{where}: job {job_id!r}"
    arrival = _number(entry, "arrival_s", where, minimum=0.0, inclusive=True)
    if arrival is None:
        raise ConfigError(f"{where}: missing arrival_s; expected seconds from the start")
    lifetime = _number(entry, "lifetime_s", where, minimum=0.0, inclusive=True)
    iterations = entry.get("iterations")
    if iterations is not None and (isinstance(iterations, bool)
                                   or not isinstance(iterations, int) or iterations <= 0):
        raise ConfigError(f"{where}: iterations = {iterations!r}; expected an integer > 0")
    if lifetime is not None and iterations is not None:
        raise ConfigError(f"{where}: both lifetime_s and iterations given; expected one")
    kind = entry.get("kind")
    if kind is not None and (not isinstance(kind, str) or not kind):
        raise ConfigError(f"{where}: kind = {kind!r}; expected a string like '14B_8k'")
    rollout, train = _pair(entry, "t_rollout_s", "t_train_s", where)
    rollout_colo, train_colo = _pair(entry, "t_rollout_colo_s", "t_train_colo_s", where)
    slo = _number(entry, "slo", where, minimum=1.0, inclusive=True)
    spec = entry.get("spec")
    if spec is not None and (not isinstance(spec, str) or not spec):
        raise ConfigError(f"{where}: spec = {spec!r}; expected a job-spec path")
    spec_path = str(base / spec) if spec is not None else None
    departure = arrival + lifetime if lifetime is not None else None
    return TraceJob(job_id, arrival, departure, kind, rollout, train, slo, rollout_colo,
                    train_colo, iterations, spec_path, line)


def _pair(entry: dict[str, Any], first: str, second: str, where: str
          ) -> tuple[float | None, float | None]:
    a = _number(entry, first, where, minimum=0.0)
    b = _number(entry, second, where, minimum=0.0)
    if (a is None) != (b is None):
        raise ConfigError(f"{where}: {first} and {second} must be given together")
    return a, b


def _number(entry: dict[str, Any], key: str, where: str, *, minimum: float,
            inclusive: bool = False) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and math.isfinite(value) and (value >= minimum if inclusive else value > minimum))
    if not ok:
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise ConfigError(f"{where}: {key} = {value!r}; expected a finite number {bound}")
    return float(value)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_toml_trace(trace: Trace, path: Path) -> None:
    """Write ``trace`` in our TOML format (profiles and SLOs included when known)."""
    out = [f"version = {FORMAT_VERSION}", f"source = {_toml_value(trace.source)}"]
    if trace.start_time is not None:
        out.append(f"start_time = {trace.start_time.replace(microsecond=0).isoformat()}")
    for job in trace.jobs:
        out += ["", "[[job]]", f"id = {_toml_value(job.job_id)}",
                f"arrival_s = {job.arrival_s!r}"]
        fields: list[tuple[str, object]] = [
            ("lifetime_s", job.lifetime_s), ("iterations", job.iterations),
            ("kind", job.kind), ("t_rollout_s", job.t_rollout_s),
            ("t_train_s", job.t_train_s), ("t_rollout_colo_s", job.t_rollout_colo_s),
            ("t_train_colo_s", job.t_train_colo_s), ("slo", job.slo), ("spec", job.spec_path)]
        out += [f"{key} = {_toml_value(value)}" for key, value in fields if value is not None]
    path.write_text("\n".join(out) + "\n")
