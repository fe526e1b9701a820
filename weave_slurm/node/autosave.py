"""When the node daemon checkpoints a job on its own: the periodic checkpoint timer.

Every registered job is checkpointed every ``interval_s`` (the daemon's default, or the
job's own from ``register``; 0 = never), counted from its registration or its last
checkpoint, and only if the versions of its segments differ from those of its newest
checkpoint (nothing changed, nothing written). The decision is pure over an injected
time; the daemon's timer thread calls ``due(now_s)`` and does the saving.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from weave_slurm.errors import ConfigError


@dataclass(frozen=True)
class AutosaveEntry:
    interval_s: float
    last_s: float            # registration or last checkpoint (or last skip)


def check_interval(value: object, where: str) -> float:
    """A checkpoint interval in seconds: a number >= 0 (0 = never)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{where}: checkpoint_interval_s {value!r} must be a number "
                          ">= 0 (0 = no periodic checkpoints)")
    return float(value)


class AutosaveTimer:
    """Per-job checkpoint deadlines (thread-safe; time is passed in)."""

    def __init__(self, default_interval_s: float) -> None:
        self.default_interval_s = check_interval(default_interval_s, "node config")
        self._jobs: dict[str, AutosaveEntry] = {}
        self._lock = threading.Lock()

    def track(self, job_id: str, now_s: float, interval_s: float | None = None) -> None:
        interval = self.default_interval_s if interval_s is None else interval_s
        with self._lock:
            self._jobs[job_id] = AutosaveEntry(interval, now_s)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def interval_s(self, job_id: str) -> float | None:
        with self._lock:
            entry = self._jobs.get(job_id)
            return None if entry is None else entry.interval_s

    def due(self, now_s: float) -> list[str]:
        """Jobs whose interval has passed, oldest deadline first."""
        with self._lock:
            found = [(e.last_s + e.interval_s, jid) for jid, e in self._jobs.items()
                     if e.interval_s > 0 and now_s >= e.last_s + e.interval_s]
        return [jid for _, jid in sorted(found)]

    def mark(self, job_id: str, now_s: float) -> None:
        """The job was just checkpointed (or found unchanged): restart its interval."""
        with self._lock:
            entry = self._jobs.get(job_id)
            if entry is not None:
                self._jobs[job_id] = AutosaveEntry(entry.interval_s, now_s)


def run_timer(tick: Callable[[], object], stop: threading.Event, period_s: float) -> None:
    """Call ``tick`` every ``period_s`` until ``stop`` is set (the thread's body)."""
    while not stop.wait(period_s):
        tick()
