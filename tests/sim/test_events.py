"""The discrete-event core: ordering, determinism, cancellation, clocks."""

from __future__ import annotations

import pytest

from weave_slurm.clock import ScaledClock, VirtualClock
from weave_slurm.errors import StateError
from weave_slurm.sim.events import EventQueue, Simulator


def test_ties_break_on_priority_then_sequence() -> None:
    sim = Simulator()
    seen: list[tuple[float, str]] = []

    def note(name: str) -> None:
        seen.append((sim.now, name))

    sim.schedule(5.0, note, "late")
    sim.schedule(1.0, note, "p1-first", priority=1)
    sim.schedule(1.0, note, "p0-first")
    sim.schedule(1.0, note, "p1-second", priority=1)
    sim.schedule(1.0, note, "p0-second")
    sim.schedule(0.5, note, "early", priority=9)
    assert sim.run() == 6
    assert seen == [(0.5, "early"), (1.0, "p0-first"), (1.0, "p0-second"),
                    (1.0, "p1-first"), (1.0, "p1-second"), (5.0, "late")]


def test_callbacks_schedule_more_and_replay_is_deterministic() -> None:
    def replay() -> list[tuple[float, int]]:
        sim = Simulator()
        log: list[tuple[float, int]] = []

        def tick(job: int, left: int) -> None:
            log.append((sim.now, job))
            if left:
                sim.schedule_in(1.0 + job % 3, tick, job, left - 1)

        for job in range(20):
            sim.schedule(0.0, tick, job, 10)
        sim.run()
        return log

    first = replay()
    assert len(first) == 20 * 11
    assert first == replay()
    assert [t for t, _ in first] == sorted(t for t, _ in first)


def test_run_until_is_inclusive_and_advances_now() -> None:
    sim = Simulator()
    seen: list[float] = []
    for at in (1.0, 2.0, 3.0):
        sim.schedule(at, seen.append, at)
    assert sim.run(until_s=2.0) == 2
    assert seen == [1.0, 2.0] and sim.now == 2.0
    assert sim.peek() == 3.0
    assert sim.run(until_s=2.5) == 0 and sim.now == 2.5
    assert sim.step() and seen == [1.0, 2.0, 3.0]
    assert not sim.step()
    assert sim.processed == 3


def test_cancel_and_past_scheduling() -> None:
    sim = Simulator()
    seen: list[str] = []
    keep = sim.schedule(1.0, seen.append, "keep")
    drop = sim.schedule(1.0, seen.append, "drop")
    sim.cancel(drop)
    assert len(sim.queue) == 1 and keep != drop
    sim.run()
    assert seen == ["keep"]
    with pytest.raises(StateError, match="before now"):
        sim.schedule(0.5, seen.append, "past")
    with pytest.raises(StateError):
        sim.schedule(float("nan"), seen.append, "nan")


def test_event_queue_peek_skips_cancelled() -> None:
    queue = EventQueue()
    first = queue.push(1.0, 0, print)
    queue.push(2.0, 0, print)
    queue.cancel(first)
    assert queue.peek_time() == 2.0
    entry = queue.pop()
    assert entry is not None and entry[0] == 2.0
    assert queue.pop() is None and queue.peek_time() == float("inf")


def test_wall_clock_sleeps_until_event_time_scaled() -> None:
    fake_now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        fake_now[0] += seconds

    clock = ScaledClock(scale=0.5, monotonic=lambda: fake_now[0], sleep=sleep)
    sim = Simulator(clock)
    seen: list[float] = []
    sim.schedule(10.0, seen.append, 10.0)
    sim.schedule(30.0, seen.append, 30.0)
    sim.run()
    assert seen == [10.0, 30.0]
    assert slept == [5.0, 10.0]  # 10 s and 20 s of simulated time at half speed
    assert clock.now() == pytest.approx(30.0)


def test_virtual_clock_tracks_simulator() -> None:
    clock = VirtualClock()
    sim = Simulator(clock)
    sim.schedule(7.0, lambda: None)
    sim.run()
    assert clock.now() == 7.0 == sim.now
