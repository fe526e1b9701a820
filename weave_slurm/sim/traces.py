"""Neutral trace records: the jobs of a replay, whatever file format they came from.

A :class:`Trace` is what every reader returns and what the replay consumes. Times are
seconds from the trace's first event (``arrival_s``, ``departure_s``); ``start_time`` keeps
the wall-clock origin when the source had one. ``events`` keeps the order of the source
file, which matters where several events share a timestamp (the reference code processes
them in file order).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from weave_slurm.vocab import member_of


class TraceFormat(enum.Enum):
    """On-disk trace formats the loader understands (``--format`` values)."""

    WILD = "wild"
    PHILLY = "philly"
    PHILLY_PARSED = "philly-parsed"
    TOML = "toml"

    @classmethod
    def parse(cls, value: str, *, flag: str = "--format") -> TraceFormat:
        """The format named ``value``; a one-line ConfigError listing the choices otherwise."""
        return member_of(cls, value, flag + ": unknown trace format {value}; valid: {choices}")


class EventKind(enum.Enum):
    """What happens to a job at a trace event."""

    ARRIVAL = 1
    DEPARTURE = -1


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One arrival or departure, at ``time_s`` seconds from the trace start."""

    time_s: float
    kind: EventKind
    job_id: str


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace.

    ``t_rollout_s``/``t_train_s`` are the solo phase times on disaggregated pools (rollout
    on h20, training on h800); ``t_rollout_colo_s``/``t_train_colo_s`` the times when both
    phases share the h800 nodes (reference ``colo`` profile). ``departure_s`` is None for a
    job that is still running at the end of the trace or that ends after ``iterations``
    iterations (our TOML format). ``source_line`` is the line (or job index, for TOML) it
    was read from, so later errors can point at it.
    """

    job_id: str
    arrival_s: float
    departure_s: float | None = None
    kind: str | None = None
    t_rollout_s: float | None = None
    t_train_s: float | None = None
    slo: float | None = None
    t_rollout_colo_s: float | None = None
    t_train_colo_s: float | None = None
    iterations: int | None = None
    spec_path: str | None = None
    source_line: int | None = None

    @property
    def lifetime_s(self) -> float | None:
        """Seconds between arrival and departure; None when the departure is open."""
        if self.departure_s is None:
            return None
        return self.departure_s - self.arrival_s

    @property
    def solo_iteration_s(self) -> float | None:
        """Solo iteration time on disaggregated pools (rollout + train), if profiled."""
        if self.t_rollout_s is None or self.t_train_s is None:
            return None
        return self.t_rollout_s + self.t_train_s

    @property
    def has_profile(self) -> bool:
        return self.t_rollout_s is not None and self.t_train_s is not None


@dataclass(frozen=True, slots=True)
class Trace:
    """Jobs of one replay, in arrival order, plus the events in source order."""

    jobs: tuple[TraceJob, ...]
    events: tuple[TraceEvent, ...]
    start_time: datetime | None
    source: str

    @classmethod
    def from_jobs(cls, jobs: Iterable[TraceJob], *, start_time: datetime | None,
                  source: str) -> Trace:
        """Build a trace whose events are sorted by time; at equal times departures
        come first (capacity is freed before it is asked for), then job order."""
        ordered = tuple(sorted(jobs, key=lambda j: j.arrival_s))
        keyed: list[tuple[float, int, int, TraceEvent]] = []
        for index, job in enumerate(ordered):
            keyed.append((job.arrival_s, 1, index,
                          TraceEvent(job.arrival_s, EventKind.ARRIVAL, job.job_id)))
            if job.departure_s is not None:
                keyed.append((job.departure_s, 0, index,
                              TraceEvent(job.departure_s, EventKind.DEPARTURE, job.job_id)))
        keyed.sort(key=lambda k: (k[0], k[1], k[2]))
        return cls(ordered, tuple(k[3] for k in keyed), start_time, source)

    def job(self, job_id: str) -> TraceJob:
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        raise KeyError(job_id)

    @property
    def end_s(self) -> float:
        """Time of the last event (0 for an empty trace)."""
        return self.events[-1].time_s if self.events else 0.0

    def concurrency(self) -> list[tuple[float, int]]:
        """(time_s, running jobs after the event) for every event, in event order."""
        running = 0
        series: list[tuple[float, int]] = []
        for event in self.events:
            running += event.kind.value
            series.append((event.time_s, running))
        return series

    def max_concurrent(self) -> int:
        return max((n for _, n in self.concurrency()), default=0)

    def mean_concurrent(self) -> float:
        """Time-weighted mean number of running jobs from the first to the last event."""
        series = self.concurrency()
        if len(series) < 2 or self.end_s <= series[0][0]:
            return 0.0
        area = sum(n * (t_next - t) for (t, n), (t_next, _) in itertools.pairwise(series))
        return area / (self.end_s - series[0][0])

    def mean_lifetime_s(self) -> float:
        """Mean lifetime of the jobs that depart inside the trace (0 if none do)."""
        lifetimes = [j.lifetime_s for j in self.jobs if j.lifetime_s is not None]
        return sum(lifetimes) / len(lifetimes) if lifetimes else 0.0

    def kind_counts(self) -> dict[str, int]:
        """Number of jobs per kind (jobs without a kind are not counted)."""
        counts: dict[str, int] = {}
        for job in self.jobs:
            if job.kind is not None:
                counts[job.kind] = counts.get(job.kind, 0) + 1
        return counts
