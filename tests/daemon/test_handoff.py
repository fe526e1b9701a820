"""Moves in flight (daemon/handoff.py) over a real store: a move that waits for its
nodes, its withdrawal once it waited ``move_wait_s``, and a job that ends while it waits.
The groups' ports are small stand-ins (the commands Handoffs gives a GroupPort); the runtime's
side of a real move is tests/runtime/test_weaved_moves.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from weave_slurm.daemon import membership
from weave_slurm.daemon.handoff import Handoffs
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.states import GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.port_commands import Command, HandOff, Leave, TakeHandOffs

from .test_replanning import CAP, T0, _replanner, _two_lone_jobs, _waiting_out_of_three

WAIT_S = 600.0


@dataclass
class _Lifecycle:
    handed: list[str] = field(default_factory=list)


@dataclass
class _Runner:
    """A group's port as Handoffs drives it: the commands it was given."""

    members: dict[str, Any]
    lifecycle: _Lifecycle = field(default_factory=_Lifecycle)   # the members handed off
    left: list[str] = field(default_factory=list)

    def apply(self, *commands: Command) -> list[Any]:
        for command in commands:
            if isinstance(command, HandOff):
                self.lifecycle.handed.append(command.job_id)
            elif isinstance(command, Leave):
                self.left.append(command.job_id)
                self.members.pop(command.job_id)
            elif not isinstance(command, TakeHandOffs):   # none at their boundary
                raise AssertionError(f"unexpected command {command}")
        return []


def _waiting_move(store: Store) -> tuple[int, int, int, _Runner, Handoffs]:
    """A committed move that needs nodes (test_replanning's growing group): job, its old
    group, its new group, the old group's runner and the moves in flight."""
    _two_lone_jobs(store, rollout_s=100.0)
    r = _replanner(store)
    r.left(1)
    r.tick(T0 + 1)
    (row,) = store.jobs(moving=True)
    src, dst = row.moving_from or 0, row.group_id or 0
    runner = _Runner({str(row.job_id): SimpleNamespace(state=MemberState.READY,
                                                       handoff=False)})
    moves = Handoffs({src: runner, dst: _Runner({})}, {}, {}, None,   # type: ignore[dict-item]
                     WAIT_S)
    return row.job_id, src, dst, runner, moves


def test_a_move_waits_for_its_nodes_then_is_withdrawn(store: Store) -> None:
    job, src, dst, runner, moves = _waiting_move(store)
    moves.hand_off(store, lambda j: False, T0 + 10)
    assert moves.waiting[job].startswith(f"moving from group {src} to group {dst}: "
                                         "waiting for its nodes there")
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S - 1)   # committed at T0 + 1
    assert store.job(job).moving_from == src   # type: ignore[union-attr]
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S)
    row = store.job(job)
    assert row is not None and (row.group_id, row.moving_from) == (src, None)
    assert row.reason == (f"its move to group {dst} was withdrawn: the nodes it needs there "
                          f"were not held within 600 s ([runtime] move_wait_s); it runs on "
                          f"in group {src}")
    assert job not in store.group(dst).plan.job_ids   # type: ignore[union-attr]
    assert store.group(src).plan.job_ids == (job,)   # type: ignore[union-attr]
    assert job not in moves.waiting and not runner.lifecycle.handed and not runner.left
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 3)
    assert not state.closed and state.job_group[str(job)] == src


def test_a_move_whose_nodes_come_is_handed_off_and_its_place_goes_once_moved(
        store: Store) -> None:
    job, src, dst, runner, moves = _waiting_move(store)
    moves.hand_off(store, lambda j: False, T0 + 10)
    moves.hand_off(store, lambda j: True, T0 + 20)
    assert runner.lifecycle.handed == [str(job)] and job not in moves.since
    runner.members[str(job)].state = MemberState.MOVED
    row = store.job(job)
    assert row is not None
    moves.moved_in(store, row, dst)
    assert job not in store.group(src).plan.job_ids   # type: ignore[union-attr]
    assert store.job(job).moving_from is None   # type: ignore[union-attr]


def _withdrawn(store: Store, job: int, src: int) -> None:
    """The move of ``job`` (committed at T0 + 1, its old group's runner holding it)
    waits for nodes that never come and is withdrawn: it is ``src``'s again."""
    runner = _Runner({str(job): SimpleNamespace(state=MemberState.READY, handoff=False)})
    moves = Handoffs({src: runner}, {}, {}, None, WAIT_S)   # type: ignore[dict-item]
    moves.hand_off(store, lambda j: False, T0 + 2)
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S)
    assert store.job(job).group_id == src   # type: ignore[union-attr]


def test_a_move_into_a_new_group_withdrawn_drains_that_group(store: Store) -> None:
    a, _ = _two_lone_jobs(store, rollout_s=100.0)
    place = GroupPlan(1, 1, (MemberPlan(a, (0,)),))
    store.commit_moves([(3, "3", place, True), (1, "1", place, False)],
                       [(a, 1, 3, "moving from group 1 to group 3")], T0 + 1)
    _withdrawn(store, a, 1)
    new = store.group(3)
    assert new is not None and new.state is GroupState.DRAINING and not new.plan.members
    assert store.transitions("group", 3)[-1].reason \
        == f"the move of its only member (job {a}) was withdrawn"


def test_a_job_that_ends_while_its_move_waits_is_let_go_by_its_old_group(
        store: Store) -> None:
    job, src, _, runner, moves = _waiting_move(store)
    moves.hand_off(store, lambda j: False, T0 + 10)
    runner.members[str(job)].state = MemberState.DONE   # its last step, in its old group
    ended = moves.ended(store, moves.movers(store))
    assert [(j, id(r)) for j, r, _ in ended] == [(job, id(runner))]
    store.transition("job", job, JobState.COMPLETED, "done", T0 + 11)   # weaved reports it
    moves.ended(store, moves.movers(store))
    assert runner.left == [str(job)]
    assert job not in store.group(src).plan.job_ids   # type: ignore[union-attr]
    assert store.job(job).moving_from is None   # type: ignore[union-attr]
    assert not store.jobs(moving=True)


def test_after_a_restart_a_waiting_job_runs_in_its_old_group_until_withdrawn(
        store: Store) -> None:
    """A fresh weaved's runners hold no member yet: the old group re-attaches the job
    whose move waits (waiting_out) unless its new group can take it now, and the wait
    still ends in a withdrawal, move_wait_s after the move was committed (not after the
    restart)."""
    job, src, dst, _, _ = _waiting_move(store)
    moves = Handoffs({src: _Runner({}), dst: _Runner({})}, {}, {}, None,   # type: ignore[dict-item]
                     WAIT_S)
    old = moves.groups[src]
    rows = moves.waiting_out(moves.movers(store), src, old, lambda j: False)
    assert [(r.job_id, r.group_id, r.moving_from) for r in rows] == [(job, src, None)]
    assert moves.waiting_out(moves.movers(store), src, old, lambda j: True) == []   # adopted there
    assert moves.waiting_out(moves.movers(store), dst, moves.groups[dst], lambda j: False) == []
    moves.hand_off(store, lambda j: False, T0 + WAIT_S)   # first seen by this weaved
    assert store.job(job).moving_from == src   # type: ignore[union-attr]
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S)
    row = store.job(job)
    assert row is not None and (row.group_id, row.moving_from) == (src, None)


def test_weave_groups_lists_a_waiting_job_once_as_a_member_moving_out_then_in(
        store: Store) -> None:
    """While it waits the job runs in its old group: a member there, moving out; in its
    new group's plan it is only moving in. Once withdrawn it is its old group's again."""
    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.api import Api

    job, src, dst, _runner, moves = _waiting_move(store)
    api = Api(store, default_site(), CAP, lambda: T0 + 10)
    views = {g["group"]: g for g in api.groups()["groups"]}
    assert (views[src]["members"], views[src]["moving_out"], views[src]["moving_in"]) == \
        ([job], [job], [])
    assert job not in views[dst]["members"] and views[dst]["moving_in"] == [job]
    assert views[dst]["moving_out"] == []
    moves.hand_off(store, lambda j: False, T0 + 10)
    moves.hand_off(store, lambda j: False, T0 + 10 + WAIT_S)   # withdrawn
    views = {g["group"]: g for g in api.groups()["groups"]}
    assert (views[src]["members"], views[src]["moving_out"]) == ([job], [])
    assert all(job not in v["members"] + v["moving_in"] for g, v in views.items() if g != src)


def test_the_group_a_waiting_job_leaves_takes_its_new_plan_once_it_is_out(
        store: Store) -> None:
    """c's old group re-pins a and e onto one node only when c has moved in; had c's
    move been withdrawn, the group would keep its plan as it is (next test)."""
    a, e, c, _, _ = _waiting_out_of_three(store)
    runner = _Runner({str(c): SimpleNamespace(state=MemberState.READY, handoff=False)})
    moves = Handoffs({1: runner, 3: _Runner({})}, {}, {}, None,   # type: ignore[dict-item]
                     WAIT_S)
    moves.hand_off(store, lambda j: True, T0 + 2)
    runner.members[str(c)].state = MemberState.MOVED
    moves.moved_in(store, store.job(c), 3)   # type: ignore[arg-type]
    old = store.group(1)
    assert old is not None and old.plan.then is None
    assert sorted(old.plan.job_ids) == sorted((a, e)) and old.plan.rollout_nodes == 1
    assert len({p for m in old.plan.members for p in m.rollout_pins}) == 1


def test_a_withdrawn_move_leaves_its_old_group_as_it_was(store: Store) -> None:
    a, e, c, _, _ = _waiting_out_of_three(store)
    _withdrawn(store, c, 1)
    old = store.group(1)
    assert old is not None and old.plan.then is None
    assert [(m.job_id, m.rollout_pins) for m in old.plan.members] == \
        [(a, (0,)), (e, (1,)), (c, (2,))]
    store.transition("job", a, JobState.COMPLETED, "done", T0 + 700)   # later departures
    assert store.group(1).plan.without({a}).job_ids == (e, c)   # type: ignore[union-attr]


def test_a_move_that_waits_for_its_new_groups_plan_goes_once_the_leaver_is_out(
        store: Store) -> None:
    """d's move into group 1 waits (its REASON says for whom) until c has moved out; then
    group 1 has d in its plan, d is handed off from group 4, and group 4 takes its own
    new plan (empty) once d has moved in."""
    a, e, c, d, _ = _waiting_out_of_three(store, entrant=True)
    one = _Runner({str(c): SimpleNamespace(state=MemberState.READY, handoff=False)})
    four = _Runner({str(d): SimpleNamespace(state=MemberState.READY, handoff=False)})
    moves = Handoffs({1: one, 3: _Runner({}), 4: four}, {}, {}, None,   # type: ignore[dict-item]
                     WAIT_S)

    def placed(job: Any) -> bool:   # c's new nodes are held; d's are once it is in plan
        return job.job_id == c or job.job_id in store.group(1).plan.job_ids  # type: ignore[union-attr]

    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.api import Api

    views = {g["group"]: g for g in Api(store, default_site(), CAP,
                                        lambda: T0 + 2).groups()["groups"]}
    assert (views[1]["members"], views[1]["moving_out"], views[1]["moving_in"]) == \
        ([a, e, c], [c], [d])
    assert (views[4]["members"], views[4]["moving_out"]) == ([d], [d])
    moves.hand_off(store, placed, T0 + 2)
    assert moves.waiting[d] == ("moving from group 4 to group 1: waiting for job(s) "
                                f"{c} to move out of group 1 first")
    assert four.lifecycle.handed == [] and one.lifecycle.handed == [str(c)]
    one.members[str(c)].state = MemberState.MOVED
    moves.moved_in(store, store.job(c), 3)   # type: ignore[arg-type]
    assert sorted(store.group(1).plan.job_ids) == sorted((a, e, d))   # type: ignore[union-attr]
    moves.hand_off(store, placed, T0 + 3)
    assert four.lifecycle.handed == [str(d)]
    four.members[str(d)].state = MemberState.MOVED
    moves.moved_in(store, store.job(d), 1)   # type: ignore[arg-type]
    left = store.group(4)
    assert left is not None and not left.plan.members and left.plan.then is None
    assert not store.jobs(moving=True)


def test_withdrawn_chained_moves_leave_both_old_groups_as_they_were(store: Store) -> None:
    a, e, c, d, _ = _waiting_out_of_three(store, entrant=True)
    moves = Handoffs({1: _Runner({str(c): SimpleNamespace(state=MemberState.READY,
                                                          handoff=False)}),
                      4: _Runner({str(d): SimpleNamespace(state=MemberState.READY,
                                                          handoff=False)})},
                     {}, {}, None, WAIT_S)   # type: ignore[dict-item]
    moves.hand_off(store, lambda j: False, T0 + 2)
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S)
    assert (store.job(c).group_id, store.job(d).group_id) == (1, 4)   # type: ignore[union-attr]
    one, four = store.group(1), store.group(4)
    assert one is not None and four is not None
    assert one.plan == GroupPlan(3, 1, tuple(MemberPlan(j, (i,)) for i, j in enumerate((a, e, c))))
    assert four.plan.job_ids == (d,) and four.plan.then is None
    assert store.job(d).reason == (   # type: ignore[union-attr]
        "its move to group 1 was withdrawn: the moves out of group 1 it waited for were not "
        "done within 600 s ([runtime] move_wait_s); it runs on in group 4")


def test_a_chained_move_is_not_withdrawn_while_the_move_it_waits_for_comes_through(
        store: Store) -> None:
    """c's nodes come just before the deadline and c finishes its step in flight after
    it: d, whose move waits for group 1's next plan, is not withdrawn meanwhile; once c
    is out and group 1 takes that plan, d's clock starts afresh and d is handed off."""
    _, _, c, d, _ = _waiting_out_of_three(store, entrant=True)
    one = _Runner({str(c): SimpleNamespace(state=MemberState.READY, handoff=False)})
    four = _Runner({str(d): SimpleNamespace(state=MemberState.READY, handoff=False)})
    moves = Handoffs({1: one, 3: _Runner({}), 4: four}, {}, {}, None,   # type: ignore[dict-item]
                     WAIT_S)
    nodes_for_c = False

    def placed(job: Any) -> bool:
        if job.job_id == c:
            return nodes_for_c
        return job.job_id in store.group(1).plan.job_ids   # type: ignore[union-attr]

    moves.hand_off(store, placed, T0 + 2)
    nodes_for_c = True
    moves.hand_off(store, placed, T0 + WAIT_S)   # just before c's deadline (T0 + 1 + WAIT_S)
    assert one.lifecycle.handed == [str(c)]
    one.members[str(c)].handoff = True   # its step in flight, past the deadline
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S + 60)
    assert (store.job(d).group_id, store.job(d).moving_from) == (1, 4)   # type: ignore[union-attr]
    assert moves.waiting[d].endswith(f"waiting for job(s) {c} to move out of group 1 first")
    one.members[str(c)].state = MemberState.MOVED
    moves.moved_in(store, store.job(c), 3)   # type: ignore[arg-type]
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S + 61)   # the plan is taken:
    assert store.job(d).moving_from == 4   # type: ignore[union-attr]   # a fresh clock
    moves.hand_off(store, placed, T0 + 1 + WAIT_S + 62)
    assert four.lifecycle.handed == [str(d)]


def test_a_chained_move_is_withdrawn_with_the_move_it_waits_for(store: Store) -> None:
    """Even when d's own tick comes first: d has no clock of its own, c's withdrawal drops
    group 1's next plan and d is withdrawn in the same tick."""
    _, _, c, d, _ = _waiting_out_of_three(store, entrant=True)
    moves = Handoffs({1: _Runner({str(c): SimpleNamespace(state=MemberState.READY,
                                                          handoff=False)}),
                      4: _Runner({str(d): SimpleNamespace(state=MemberState.READY,
                                                          handoff=False)})},
                     {}, {}, None, WAIT_S)   # type: ignore[dict-item]
    moves.since[d] = T0 - WAIT_S   # d's clock, were it its own, would have run out long ago
    moves.hand_off(store, lambda j: False, T0 + 2)
    assert store.job(d).moving_from == 4   # type: ignore[union-attr]
    moves.hand_off(store, lambda j: False, T0 + 1 + WAIT_S)
    assert (store.job(c).group_id, store.job(d).group_id) == (1, 4)   # type: ignore[union-attr]
    assert store.job(d).moving_from is None   # type: ignore[union-attr]
