"""The pure decisions: cyclic order (of turns), hung-phase deadlines, profiling."""

from __future__ import annotations

from weave_slurm.runtime.group import DeclaredProfile
from weave_slurm.runtime.ordering import next_member, next_slot, phase_deadline_s, turn_slots
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.vocab import Phase


def test_cyclic_order_starts_after_the_last_served() -> None:
    order = ["a", "b", "c"]
    assert next_member(order, None, {"a", "b", "c"}) == "a"
    assert next_member(order, "a", {"a", "b", "c"}) == "b"
    assert next_member(order, "c", {"a", "b", "c"}) == "a"


def test_work_conserving_skips_a_member_that_is_not_ready() -> None:
    assert next_member(["a", "b", "c"], "a", {"c", "a"}) == "c"
    assert next_member(["a", "b", "c"], "a", set()) is None
    assert next_member([], None, {"a"}) is None


def test_a_member_with_several_turns_appears_that_often_spread_over_the_cycle() -> None:
    assert turn_slots(["a", "b"], [1, 1]) == ("a", "b")
    assert turn_slots(["a", "b"], [1, 2]) == ("b", "a", "b")
    assert turn_slots(["a", "b", "c"], [1, 3, 1]) == ("b", "a", "b", "c", "b")
    # work-conserving over the places: the next ready member after the last place
    slots = ("b", "a", "b")
    assert next_slot(slots, 0, {"a", "b"}) == 1
    assert next_slot(slots, 1, {"a", "b"}) == 2
    assert next_slot(slots, 2, {"a", "b"}) == 0
    assert next_slot(slots, 0, {"b"}) == 2
    assert next_slot(slots, 7, {"a"}) == 1          # a stale place starts at the head


def test_in_turn_order_a_pool_waits_for_the_next_turns_member() -> None:
    slots = ("b", "a", "b")
    # a's turn is next and a is cycling: b is ready but the pool waits for a
    assert next_slot(slots, 0, {"b"}, cycling={"a", "b"}) is None
    assert next_slot(slots, 0, {"a", "b"}, cycling={"a", "b"}) == 1
    # a member not cycling (recovering, done) is passed over
    assert next_slot(slots, 0, {"b"}, cycling={"b"}) == 2


def test_deadline_from_measured_then_declared_with_floor() -> None:
    assert phase_deadline_s(None, [], 4.0, 30.0) == 30.0
    assert phase_deadline_s(20.0, [], 4.0, 30.0) == 80.0
    assert phase_deadline_s(20.0, [1.0, 12.0], 4.0, 30.0) == 48.0
    assert phase_deadline_s(20.0, [1.0, 2.0], 4.0, 30.0) == 30.0


def test_profiler_flags_drift_and_computes_slowdown() -> None:
    prof = LiveProfiler(drift_tolerance=0.5, min_samples=3)
    prof.track("j", DeclaredProfile(rollout_s=1.0, train_s=1.0, slo=1.5))
    for t in (0.0, 3.0, 6.0, 9.0):
        prof.iteration_end("j", t)
    for _ in range(3):
        prof.phase("j", Phase.ROLLOUT, 2.0)   # twice the declared
        prof.phase("j", Phase.TRAIN, 1.0)
    snap = prof.snapshot()["j"]
    assert snap.solo_iteration_s == 3.0
    assert snap.group_iteration_s == 3.0
    assert snap.slowdown == 1.0 and snap.slo_ok is True
    assert len(snap.drift) == 1 and snap.drift[0].startswith("rollout")
