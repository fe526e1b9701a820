"""Each group's worker thread (daemon/group_workers.py), with a tick that counts or
blocks on an event: work runs between ticks under the group's lock, a busy group is
handed no second round and reports its late one on a later call, a stuck worker holds
no other, and stopping leaves a stuck worker's port alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.daemon.group_workers import GroupSlot, Rounds, Workers, acquire_all
from weave_slurm.daemon.states import JobState


class Ticks:
    """A tick per group that counts, and blocks while its group's gate is shut."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.gates: dict[int, threading.Event] = {}

    def gate(self, gid: int) -> threading.Event:
        return self.gates.setdefault(gid, threading.Event())

    def __call__(self, slot: GroupSlot) -> bool:
        gate = self.gates.get(slot.group_id)
        if gate is not None:
            gate.wait(30)
        self.count[slot.group_id] = self.count.get(slot.group_id, 0) + 1
        return False


def _until(probe: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if probe():
            return True
        time.sleep(0.01)
    return probe()


def _free(slot: GroupSlot) -> bool:
    """Whether another thread could take ``slot``'s lock now."""
    got: list[bool] = []

    def take() -> None:
        got.append(slot.lock.acquire(blocking=False))
        if got[0]:
            slot.lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return got[0]


def _done(job_id: int) -> Callable[[], list[JobOutcome]]:
    return lambda: [JobOutcome(job_id, JobState.COMPLETED, "done")]


def test_work_runs_at_once_before_start_and_on_the_worker_after() -> None:
    ticks = Ticks()
    workers = Workers(ticks, 0.01)
    slot = workers.slots([1])[1]
    assert slot.submit(threading.current_thread).result(0) is threading.current_thread()
    workers.start()
    slot.port = object()   # type: ignore[assignment]   # ticked from now on
    on = slot.submit(lambda: (threading.current_thread().name, _free(slot)))
    assert on.result(5) == ("weaved-group-1", False)   # on its worker, under its lock
    assert _until(lambda: ticks.count.get(1, 0) >= 3)
    assert workers.stop(5) == [slot]


def test_a_stuck_group_holds_no_other_and_reports_its_round_later() -> None:
    ticks = Ticks()
    workers = Workers(ticks, 0.01)
    workers.start()
    slots = workers.slots([1, 2])
    for slot in slots.values():
        slot.port = object()   # type: ignore[assignment]
    stuck = ticks.gate(2)      # group 2's tick blocks on its "node" until the gate opens
    assert _until(lambda: ticks.count.get(1, 0) >= 1)
    rounds = Rounds()
    rounds.hand(slots[1], _done(10))
    rounds.hand(slots[2], _done(20))
    start = time.monotonic()
    assert [o.job_id for o in rounds.finished(0.5)] == [10]
    assert time.monotonic() - start < 2
    assert rounds.busy() == {2}
    rounds.hand(slots[2], _done(21))   # busy: not handed a second round
    rounds.hand(slots[1], _done(11))
    start = time.monotonic()           # a late round is not waited for again
    assert [o.job_id for o in rounds.finished(10)] == [11]
    assert time.monotonic() - start < 2
    before = ticks.count[1]
    assert _until(lambda: ticks.count[1] >= before + 5)   # group 1 ticks on meanwhile
    assert acquire_all(slots.values(), 0.2) == [slots[1]]  # group 2's lock is held
    slots[1].lock.release()
    stuck.set()
    assert _until(lambda: not rounds.busy())
    assert [o.job_id for o in rounds.finished(0.5)] == [20]
    assert rounds.finished(0.5) == []   # read once
    assert sorted(s.group_id for s in workers.stop(5)) == [1, 2]


def test_a_group_ended_by_its_own_worker_is_forgotten_and_its_worker_ends() -> None:
    workers = Workers(Ticks(), 0.01)
    workers.start()
    slot = workers.slots([3])[3]
    slot.submit(lambda: workers.end(slot)).result(5)
    assert workers.slots() == {} and slot.join(5) and slot.closed
    assert slot.submit(lambda: 7).result(0) == 7   # late work runs at once, here


def test_stopping_reports_a_worker_still_stuck_on_its_nodes() -> None:
    ticks = Ticks()
    workers = Workers(ticks, 0.01)
    workers.start()
    slot = workers.slots([4])[4]
    gate = ticks.gate(4)
    slot.port = object()   # type: ignore[assignment]
    time.sleep(0.1)        # its first tick blocks
    assert workers.stop(0.2) == []
    gate.set()
    assert slot.join(5)
