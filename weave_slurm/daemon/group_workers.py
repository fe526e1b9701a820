"""Each group's runtime on a thread of its own, so that one group's node calls never hold
another's (docs/reliability.md, C2).

A :class:`GroupSlot` is one active group inside weaved's group runtime
(:mod:`weave_slurm.daemon.group_runtime`): its port (``None`` until its runtime is built,
and again after it detached), the lock that port is used under, and its worker thread.
The worker ticks the port every ``poll_s`` (every :data:`HANDOFF_S` while a tick has
work) and, between two ticks, carries out the membership work the reconcile loop hands
it (:meth:`GroupSlot.submit`: joins, leaves, re-attach, extend, detach, close). So a
group whose node calls block (a stopped slurmd under its sync agent's ``srun``, a node
daemon that does not answer) holds only its own worker: the other groups tick and take
their members in meanwhile, and the reconcile loop, which waits a bounded time for each
group's work (:class:`Rounds`), reads the late group's result on a later tick.
:class:`Workers` keeps the slots: one per active group, forgotten (its worker ended)
when the group ends, so the threads are as many as the active groups.

Before :meth:`GroupSlot.start` (unit tests, or a runtime not started) submitted work
runs at once in the caller's thread, under the slot's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import TypeVar

from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.runtime.port import GroupPort

log = logging.getLogger(__name__)

#: How long a group's worker leaves its lock free between two ticks that had work (the
#: reconcile loop's moves and the group's close get in then).
HANDOFF_S = 0.002

T = TypeVar("T")


class GroupSlot:
    """One group's runtime, its lock and its worker thread (module doc)."""

    def __init__(self, group_id: int, tick: Callable[[GroupSlot], bool],
                 poll_s: float) -> None:
        self.group_id = group_id
        self.port: GroupPort | None = None
        self.lock = threading.RLock()       # the port is used under it, by one thread
        self.closed = False                 # its group ended: the worker stops
        self._tick, self._poll_s = tick, poll_s
        self._work: deque[tuple[Callable[[], object], Future[object]]] = deque()
        self._queue_lock = threading.Lock()
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker (once)."""
        with self._queue_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"weaved-group-{self.group_id}")
                self._thread.start()

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` under the slot's lock on its worker, between two ticks (at once,
        here, when the worker is not running); its result as a future."""
        future: Future[T] = Future()
        with self._queue_lock:
            queued = self._thread is not None and self._thread.is_alive() \
                and not self._stop.is_set()
            if queued:
                self._work.append((work, future))  # type: ignore[arg-type]
        if queued:
            self._kick.set()
        else:
            self._run(work, future)
        return future

    def stop(self) -> None:
        """The worker ends once the work already submitted is done."""
        self._stop.set()
        self._kick.set()

    def join(self, timeout_s: float) -> bool:
        """Wait for the worker to end; False if it still runs (a node call blocks it)."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _run(self, work: Callable[[], T], future: Future[T]) -> None:
        with self.lock:
            try:
                future.set_result(work())
            except BaseException as exc:   # the submitter reads it from the future
                future.set_exception(exc)

    def _next(self) -> tuple[Callable[[], object], Future[object]] | None:
        with self._queue_lock:
            return self._work.popleft() if self._work else None

    def _loop(self) -> None:
        while True:
            self._kick.clear()
            while (item := self._next()) is not None:
                self._run(*item)
            if self._stop.is_set() or self.closed:
                break
            changed = False
            with self.lock:
                if self.port is not None and not self.closed:
                    changed = self._tick(self)
            self._kick.wait(HANDOFF_S if changed else self._poll_s)
        with self._queue_lock:   # what came in meanwhile runs here, now
            self._stop.set()
            rest, self._work = list(self._work), deque()
        for item in rest:
            self._run(*item)


class Workers:
    """Every active group's :class:`GroupSlot`, by group id. A slot made once the
    workers run starts its worker at once; one whose group ended is forgotten."""

    def __init__(self, tick: Callable[[GroupSlot], bool], poll_s: float) -> None:
        self._tick, self._poll_s = tick, poll_s
        self._slots: dict[int, GroupSlot] = {}
        self._lock = threading.Lock()    # for the dict only, never held long
        self._started = False

    def slots(self, new: Iterable[int] = ()) -> dict[int, GroupSlot]:
        """Every slot, after making one for each group of ``new`` that has none."""
        with self._lock:
            for gid in new:
                if gid not in self._slots:
                    slot = self._slots[gid] = GroupSlot(gid, self._tick, self._poll_s)
                    if self._started:
                        slot.start()
            return dict(self._slots)

    def get(self, group_id: int) -> GroupSlot | None:
        return self._slots.get(group_id)

    def end(self, slot: GroupSlot) -> None:
        """The slot's group ended: its worker stops once its work is done (when called
        on that worker: right after), and the slot is forgotten."""
        slot.closed = True
        slot.stop()
        with self._lock:
            if self._slots.get(slot.group_id) is slot:
                del self._slots[slot.group_id]

    def start(self) -> None:
        """Start every slot's worker, and from now on each new slot's."""
        with self._lock:
            self._started = True
            slots = list(self._slots.values())
        for slot in slots:
            slot.start()

    def stop(self, timeout_s: float) -> list[GroupSlot]:
        """Stop every worker; the slots whose worker ended within ``timeout_s`` in all
        (their ports may be closed now; the others wait on their nodes)."""
        with self._lock:
            self._started = False
            slots = list(self._slots.values())
        for slot in slots:
            slot.stop()
        end = time.monotonic() + timeout_s
        ended = []
        for slot in slots:
            if slot.join(max(0.0, end - time.monotonic())):
                ended.append(slot)
            else:
                log.warning("group %s: its worker still waits on its nodes at weaved's "
                            "stop; left to end with weaved", slot.group_id)
        return ended


class Rounds:
    """The membership work one reconcile tick hands each group's worker, and the work of
    earlier ticks still running: a group is handed new work only once its last is done,
    and a round's outcomes are read whenever it ends (never lost, never read twice)."""

    def __init__(self) -> None:
        self._running: dict[int, Future[list[JobOutcome]]] = {}
        self._ended: list[tuple[int, Future[list[JobOutcome]]]] = []
        self._fresh: dict[int, Future[list[JobOutcome]]] = {}   # handed since the last read

    def busy(self) -> set[int]:
        """The groups whose last round still runs."""
        return {gid for gid, f in self._running.items() if not f.done()}

    def hand(self, slot: GroupSlot, work: Callable[[], list[JobOutcome]]) -> None:
        """Hand ``work`` to ``slot`` unless its last round still runs."""
        last = self._running.get(slot.group_id)
        if last is not None:
            if not last.done():
                return
            self._ended.append((slot.group_id, last))
        future = self._running[slot.group_id] = slot.submit(work)
        self._fresh[slot.group_id] = future

    def finished(self, wait_s: float) -> list[JobOutcome]:
        """The outcomes of every round that ended; waits up to ``wait_s`` for the rounds
        handed since the last call (one still running then reports on a later call; a
        round already late is not waited for again)."""
        fresh, self._fresh = self._fresh, {}
        if fresh:
            wait(list(fresh.values()), timeout=wait_s)
        ended, self._ended = self._ended, []
        for gid, future in list(self._running.items()):
            if future.done():
                ended.append((gid, self._running.pop(gid)))
            elif gid in fresh:
                log.info("group %s: its membership work still waits on its nodes; its "
                         "outcomes come on a later tick", gid)
        out: list[JobOutcome] = []
        for gid, future in ended:
            try:
                out += future.result()
            except Exception:
                log.exception("group %s: membership work failed; the next tick tries "
                              "again", gid)
        return out


def acquire_all(slots: Iterable[GroupSlot], wait_s: float) -> list[GroupSlot]:
    """Take the locks of ``slots`` whose workers let go of them within ``wait_s`` in all
    (a tick takes milliseconds; one that blocks on its nodes keeps its group out)."""
    end = time.monotonic() + wait_s
    held = []
    for slot in slots:
        if slot.lock.acquire(timeout=max(0.0, end - time.monotonic())):
            held.append(slot)
    return held
