"""A tiny discrete-event core (after SimPy): ``now``, ``schedule``, ``step``, ``run``.

Events live in a binary heap of plain tuples ``(time_s, priority, sequence, callback,
args)``. ``sequence`` is a per-simulator counter, so ties on time break on priority
(lower first) and then on scheduling order: a replay is reproducible bit for bit.

Time is injected. ``Simulator.now`` is the time of the event being processed (virtual
seconds). The clock (:mod:`weave_slurm.clock`) only paces the loop: a ``VirtualClock``
jumps straight to the next event; a ``ScaledClock`` sleeps until the event's
wall-clock deadline, so the live daemon can drive the same callbacks in real time.

Cancellation is lazy (a cancelled entry is skipped when it reaches the top), which keeps
``schedule`` and ``step`` at one heap operation each.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from weave_slurm.clock import Clock, VirtualClock
from weave_slurm.errors import StateError

Callback = Callable[..., object]
_Entry = tuple[float, int, int, Callback, tuple[Any, ...]]


class EventQueue:
    """Heap of events ordered by (time_s, priority, sequence)."""

    __slots__ = ("_cancelled", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = 0
        self._cancelled: set[int] = set()

    def push(self, time_s: float, priority: int, callback: Callback,
             args: tuple[Any, ...] = ()) -> int:
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (time_s, priority, seq, callback, args))
        return seq

    def cancel(self, seq: int) -> None:
        """Drop a pending entry (a no-op for one already popped)."""
        self._cancelled.add(seq)

    def push_back(self, entry: _Entry) -> None:
        """Return an entry taken with :meth:`pop` (keeps its sequence number)."""
        heapq.heappush(self._heap, entry)

    def pop(self) -> _Entry | None:
        """Next live entry, or None when the queue is empty."""
        heap, cancelled = self._heap, self._cancelled
        while heap:
            entry = heapq.heappop(heap)
            if cancelled and entry[2] in cancelled:
                cancelled.discard(entry[2])
                continue
            return entry
        return None

    def peek_time(self) -> float:
        """Time of the next live entry (``inf`` when empty)."""
        heap, cancelled = self._heap, self._cancelled
        while heap and cancelled and heap[0][2] in cancelled:
            cancelled.discard(heapq.heappop(heap)[2])
        return heap[0][0] if heap else math.inf

    def __len__(self) -> int:
        cancelled = self._cancelled
        return sum(1 for entry in self._heap if entry[2] not in cancelled)


class Simulator:
    """The event loop: schedule callbacks at times, then ``step`` or ``run``."""

    def __init__(self, clock: Clock | None = None, start_s: float = 0.0) -> None:
        self.clock: Clock = clock if clock is not None else VirtualClock(start_s)
        self.queue = EventQueue()
        self._now_s = start_s
        self.processed = 0

    @property
    def now(self) -> float:
        return self._now_s

    def schedule(self, at_s: float, callback: Callback, *args: Any, priority: int = 0) -> int:
        """Call ``callback(*args)`` at ``at_s``; returns a handle for :meth:`cancel`."""
        if not at_s >= self._now_s:  # also rejects NaN
            raise StateError(f"cannot schedule at t={at_s!r} s: before now={self._now_s!r} s")
        return self.queue.push(at_s, priority, callback, args)

    def schedule_in(self, delay_s: float, callback: Callback, *args: Any,
                    priority: int = 0) -> int:
        return self.schedule(self._now_s + delay_s, callback, *args, priority=priority)

    def cancel(self, handle: int) -> None:
        self.queue.cancel(handle)

    def peek(self) -> float:
        """Time of the next event (``inf`` when none)."""
        return self.queue.peek_time()

    def step(self) -> bool:
        """Process one event; False when there was none."""
        entry = self.queue.pop()
        if entry is None:
            return False
        at_s, _, _, callback, args = entry
        self.clock.sleep_until(at_s)
        self._now_s = at_s
        self.processed += 1
        callback(*args)
        return True

    def run(self, until_s: float | None = None) -> int:
        """Process events in order; with ``until_s``, only those at or before it, then
        advance ``now`` to ``until_s``. Returns the number of events processed."""
        if until_s is not None and not until_s >= self._now_s:
            raise StateError(f"cannot run until t={until_s!r} s: before now={self._now_s!r} s")
        limit = math.inf if until_s is None else until_s
        queue, clock = self.queue, self.clock
        count = 0
        try:
            while True:
                entry = queue.pop()
                if entry is None:
                    break
                at_s = entry[0]
                if at_s > limit:
                    queue.push_back(entry)
                    break
                clock.sleep_until(at_s)
                self._now_s = at_s
                count += 1
                entry[3](*entry[4])
        finally:
            self.processed += count
        if until_s is not None and until_s > self._now_s:
            clock.sleep_until(until_s)
            self._now_s = until_s
        return count
