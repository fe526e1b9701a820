"""Readers and a writer for the reference artifact's comma-separated event traces.

Three line formats (one event per line, in time order, fields separated by ``,`` with
optional spaces; blank lines and lines starting with ``#`` are skipped):

- ``wild``: ``<job>, <YYYY-mm-dd HH:MM:SS>, <1|-1>, <kind>`` (kind like ``14B_8k``);
- ``philly``: ``<job>, <YYYY-mm-dd HH:MM:SS>, <1|-1>``;
- ``philly-parsed``: arrival lines ``<job>, <time>, 1, <t_rollout_s>, <t_train_s>, <slo>``,
  departure lines ``<job>, <time>, -1``.

Any malformed line is a one-line :class:`ConfigError` naming the file and line number.
Job ids are kept verbatim (the reference strips a ``job``/``application_`` prefix).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.sim.traces import EventKind, Trace, TraceEvent, TraceFormat, TraceJob

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"

_LAYOUTS: dict[TraceFormat, tuple[str, str]] = {
    TraceFormat.WILD: ("<job>, <YYYY-mm-dd HH:MM:SS>, <1|-1>, <kind>",
                       "<job>, <YYYY-mm-dd HH:MM:SS>, <1|-1>, <kind>"),
    TraceFormat.PHILLY: ("<job>, <YYYY-mm-dd HH:MM:SS>, 1", "<job>, <YYYY-mm-dd HH:MM:SS>, -1"),
    TraceFormat.PHILLY_PARSED: ("<job>, <YYYY-mm-dd HH:MM:SS>, 1, <t_rollout_s>, <t_train_s>, "
                                "<slo>", "<job>, <YYYY-mm-dd HH:MM:SS>, -1"),
}


def split_line(line: str) -> list[str] | None:
    """Fields of a data line, or None for a blank or comment line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    return [f.strip() for f in text.split(",")]


def detect_line_format(lines: Iterable[str]) -> TraceFormat | None:
    """Guess the format from the first arrival line (4 fields: wild, 6: philly-parsed,
    3: philly); None when no line looks like an arrival."""
    for line in lines:
        fields = split_line(line)
        if fields is None or len(fields) < 3 or fields[2] != "1":
            continue
        return {4: TraceFormat.WILD, 6: TraceFormat.PHILLY_PARSED,
                3: TraceFormat.PHILLY}.get(len(fields))
    return None


@dataclass
class _Parser:
    """Line-by-line state of one read: the jobs seen so far and the clock."""

    fmt: TraceFormat
    source: str
    start: datetime | None = None
    last_s: float = 0.0
    jobs: dict[str, TraceJob] = field(default_factory=dict)
    departed: set[str] = field(default_factory=set)
    events: list[TraceEvent] = field(default_factory=list)

    def fail(self, lineno: int, what: str) -> ConfigError:
        return ConfigError(f"{self.source}:{lineno}: {what}")

    def feed(self, lineno: int, line: str) -> None:
        fields = split_line(line)
        if fields is None:
            return
        if len(fields) < 3:
            raise self._shape_error(lineno, fields, EventKind.ARRIVAL)
        kind = self._event_kind(lineno, fields[2])
        arrival_layout, departure_layout = _LAYOUTS[self.fmt]
        layout = arrival_layout if kind is EventKind.ARRIVAL else departure_layout
        if len(fields) != layout.count(",") + 1:
            raise self._shape_error(lineno, fields, kind)
        job_id = fields[0]
        if not job_id:
            raise self.fail(lineno, f"empty job id; expected {layout}")
        time_s = self._time(lineno, fields[1])
        if kind is EventKind.ARRIVAL:
            self._arrive(lineno, job_id, time_s, fields)
        else:
            self._depart(lineno, job_id, time_s, fields)
        self.last_s = time_s
        self.events.append(TraceEvent(time_s, kind, job_id))

    def _shape_error(self, lineno: int, fields: list[str], kind: EventKind) -> ConfigError:
        arrival_layout, departure_layout = _LAYOUTS[self.fmt]
        layout = arrival_layout if kind is EventKind.ARRIVAL else departure_layout
        want = layout.count(",") + 1
        hint = ""
        if self.fmt is TraceFormat.PHILLY and len(fields) == 6:
            hint = " (profiles on arrival lines: use --format philly-parsed)"
        return self.fail(lineno, f"{len(fields)} field(s) in {_quote(','.join(fields))}, "
                                 f"expected {want} for {self.fmt.value}: {layout}{hint}")

    def _event_kind(self, lineno: int, text: str) -> EventKind:
        if text == "1":
            return EventKind.ARRIVAL
        if text == "-1":
            return EventKind.DEPARTURE
        raise self.fail(lineno, f"event {_quote(text)} invalid; expected 1 (arrival) "
                                f"or -1 (departure)")

    def _time(self, lineno: int, text: str) -> float:
        try:
            when = datetime.strptime(text, TIME_FORMAT)
        except ValueError:
            raise self.fail(lineno, f"time {_quote(text)} invalid; expected "
                                    f"YYYY-mm-dd HH:MM:SS") from None
        if self.start is None:
            self.start = when
        return (when - self.start).total_seconds()

    def _arrive(self, lineno: int, job_id: str, time_s: float, fields: list[str]) -> None:
        if job_id in self.jobs:
            first = self.jobs[job_id].source_line
            raise self.fail(lineno, f"duplicate arrival of job {_quote(job_id)} "
                                    f"(first arrived on line {first}); job ids must be unique")
        self._check_order(lineno, time_s)
        job = TraceJob(job_id, time_s, source_line=lineno)
        if self.fmt is TraceFormat.WILD:
            job = replace(job, kind=self._kind(lineno, fields[3]))
        elif self.fmt is TraceFormat.PHILLY_PARSED:
            t_rollout = self._number(lineno, "t_rollout_s", fields[3], minimum=0.0)
            t_train = self._number(lineno, "t_train_s", fields[4], minimum=0.0)
            slo = self._number(lineno, "slo", fields[5], minimum=1.0, inclusive=True)
            job = replace(job, t_rollout_s=t_rollout, t_train_s=t_train, slo=slo)
        self.jobs[job_id] = job

    def _depart(self, lineno: int, job_id: str, time_s: float, fields: list[str]) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise self.fail(lineno, f"departure of unknown job {_quote(job_id)}; "
                                    f"expected an earlier arrival line for it")
        if job_id in self.departed:
            raise self.fail(lineno, f"job {_quote(job_id)} departs twice; expected one "
                                    f"departure per arrival")
        if time_s < job.arrival_s:
            raise self.fail(lineno, f"job {_quote(job_id)} departs at {fields[1]}, before "
                                    f"its arrival (line {job.source_line}); expected "
                                    f"departure >= arrival")
        self._check_order(lineno, time_s)
        if self.fmt is TraceFormat.WILD and fields[3] != job.kind:
            raise self.fail(lineno, f"departure kind {_quote(fields[3])} differs from "
                                    f"arrival kind {_quote(job.kind or '')} (line "
                                    f"{job.source_line}); expected the same kind")
        self.jobs[job_id] = replace(job, departure_s=time_s)
        self.departed.add(job_id)

    def _check_order(self, lineno: int, time_s: float) -> None:
        if time_s < self.last_s:
            raise self.fail(lineno, f"time goes backwards ({time_s:g} s after start < "
                                    f"previous {self.last_s:g} s); expected lines in time "
                                    f"order")

    def _kind(self, lineno: int, text: str) -> str:
        if not text:
            raise self.fail(lineno, "empty job kind; expected e.g. '14B_8k'")
        return text

    def _number(self, lineno: int, name: str, text: str, *, minimum: float,
                inclusive: bool = False) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_small = value < minimum if inclusive else value <= minimum
        if not math.isfinite(value) or too_small:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise self.fail(lineno, f"{name} {_quote(text)} invalid; expected a finite "
                                    f"number {bound}")
        return value

    def finish(self) -> Trace:
        if not self.events:
            raise ConfigError(f"{self.source}: no events; expected lines like "
                              f"{_LAYOUTS[self.fmt][0]}")
        return Trace(tuple(self.jobs.values()), tuple(self.events), self.start, self.source)


def _quote(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_event_lines(lines: Iterable[str], fmt: TraceFormat, source: str) -> Trace:
    """Parse lines of a ``wild``/``philly``/``philly-parsed`` trace; fields the format
    lacks (profiles, SLOs) stay None for the loader to fill."""
    if fmt not in _LAYOUTS:
        raise ConfigError(f"{source}: format {fmt.value!r} is not a line format; valid: "
                          f"{', '.join(f.value for f in _LAYOUTS)}")
    parser = _Parser(fmt, source)
    for lineno, line in enumerate(lines, start=1):
        parser.feed(lineno, line)
    return parser.finish()


def format_time(start: datetime, offset_s: float) -> str:
    return (start + timedelta(seconds=round(offset_s))).strftime(TIME_FORMAT)


def write_event_lines(trace: Trace, path: Path, fmt: TraceFormat = TraceFormat.WILD,
                      *, start: datetime | None = None) -> None:
    """Write ``trace`` as a ``wild`` (needs kinds), ``philly`` or ``philly-parsed``
    (needs profiles and SLOs) file. Times are rounded to whole seconds."""
    origin = start or trace.start_time or datetime(2025, 1, 1)
    by_id = {job.job_id: job for job in trace.jobs}
    out: list[str] = []
    for event in trace.events:
        job = by_id[event.job_id]
        stamp = format_time(origin, event.time_s)
        row = [job.job_id, stamp, str(event.kind.value)]
        if fmt is TraceFormat.WILD:
            if job.kind is None:
                raise ConfigError(f"{path}: job {job.job_id!r} has no kind; the wild "
                                  f"format needs one per job")
            row.append(job.kind)
        elif fmt is TraceFormat.PHILLY_PARSED and event.kind is EventKind.ARRIVAL:
            if job.t_rollout_s is None or job.t_train_s is None or job.slo is None:
                raise ConfigError(f"{path}: job {job.job_id!r} lacks a profile or SLO; "
                                  f"philly-parsed needs both")
            row += [repr(job.t_rollout_s), repr(job.t_train_s), repr(job.slo)]
        elif fmt not in _LAYOUTS:
            raise ConfigError(f"{path}: {fmt.value!r} is not a line format")
        out.append(", ".join(row))
    path.write_text("\n".join(out) + "\n")
