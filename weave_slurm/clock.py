"""The one clock protocol: decision code and loops get time injected, never read it.

Every clock has ``now()`` (seconds), ``sleep(seconds)`` and ``sleep_until(time_s)``.
The live daemon uses :class:`SystemClock` (timestamps it persists) and the group
runtime :class:`MonotonicClock`; the simulator uses :class:`VirtualClock` (jumps, never
blocks) or :class:`ScaledClock` (simulated seconds paced in wall time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from weave_slurm.errors import ConfigError


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def sleep_until(self, time_s: float) -> None: ...


class _RealClock:
    _now: Callable[[], float]

    def now(self) -> float:
        return self._now()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def sleep_until(self, time_s: float) -> None:
        self.sleep(time_s - self.now())


class MonotonicClock(_RealClock):
    """Real time that never jumps (durations, deadlines)."""

    _now = staticmethod(time.monotonic)


class SystemClock(_RealClock):
    """Wall-clock time (timestamps that are persisted or shown)."""

    _now = staticmethod(time.time)


class VirtualClock:
    """Simulated time: sleeping jumps, never blocks."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now(self) -> float:
        return self._now_s

    def sleep(self, seconds: float) -> None:
        self._now_s += max(0.0, seconds)

    def sleep_until(self, time_s: float) -> None:
        self._now_s = max(self._now_s, time_s)


class ScaledClock:
    """Real time for a simulator: simulated second ``t`` happens ``t * scale`` wall
    seconds after the clock was made (``scale`` < 1 runs faster than real time)."""

    def __init__(self, start_s: float = 0.0, scale: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not math.isfinite(scale) or scale <= 0:
            raise ConfigError(f"clock scale {scale!r} invalid; expected a finite number > 0")
        self._start_s = start_s
        self._scale = scale
        self._monotonic = monotonic
        self._sleep = sleep
        self._origin = monotonic()

    def now(self) -> float:
        return self._start_s + (self._monotonic() - self._origin) / self._scale

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now() + seconds)

    def sleep_until(self, time_s: float) -> None:
        while True:
            remaining = (time_s - self.now()) * self._scale
            if remaining <= 0:
                return
            self._sleep(remaining)
