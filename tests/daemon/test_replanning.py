"""weaved's re-planning decisions over a real store (daemon/replanning.py): what it
commits, when it refuses, and when an emptied group drains. The runtime's side of a
move (hand-off, adoption) is tests/runtime/test_weaved_moves.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from tests.harness.specs import stored
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.runtime import RUNTIME_DEFAULTS
from weave_slurm.config.site import default_site
from weave_slurm.daemon import allocplan, membership
from weave_slurm.daemon.placing import Placer
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.replanning import Replanner
from weave_slurm.daemon.states import GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity, ClusterState, Group, Member, WeavePolicy
from weave_slurm.placement.replan import Replan

T0 = 1_000.0
CAP = Capacity(max_group_size=2, max_rollout_nodes_per_group=8, rollout_mem_gib=2048,
               train_mem_gib=2048, rollout_pool_nodes=8, train_pool_nodes=8,
               rates=CostRates(rollout_node_hour=14.8, train_node_hour=42.2))
SPEC = job_spec_toml("{name}", iterations=100)
COOP = SPEC + '\n[launch]\nscript = "python train.py"\n'



def _running(store: Store, name: str, gid: int, spec: str = SPEC,
             rollout_s: float = 10.0) -> int:
    job = store.add_job(uid=1000, user="alice", name=name,
                        **stored(name, spec.replace("{name}", name)),
                        source=f"{name}.toml", now=T0,
                        profile=simple_profile(name, rollout_s, 10, 3.0 if rollout_s <= 10
                                               else 1.5))
    store.commit_placement([], [(job, gid, "placed")], T0)
    store.transition("job", job, JobState.RUNNING, "started", T0)
    return job


def _group(store: Store, gid: int, jobs: list[int], state: GroupState = GroupState.ACTIVE
           ) -> None:
    plan = GroupPlan(1, 1, tuple(MemberPlan(j, (0,)) for j in jobs))
    if store.group(gid) is None:
        store.add_group(gid, str(gid), plan, T0, "test")
    else:
        store.update("group", gid, plan=plan.to_json())
    if state is GroupState.ACTIVE:
        store.transition("group", gid, GroupState.ACTIVE, "held", T0)


def _two_lone_jobs(store: Store, second: GroupState = GroupState.ACTIVE,
                   spec: str = SPEC, rollout_s: float = 10.0) -> tuple[int, int]:
    """Jobs a and b alone in groups 1 and 2 (with ``rollout_s`` = 100 they cannot share
    a rollout node, only the training node)."""
    _group(store, 1, [], GroupState.FORMING)
    _group(store, 2, [], GroupState.FORMING)
    a, b = (_running(store, "a", 1, spec, rollout_s), _running(store, "b", 2, spec, rollout_s))
    _group(store, 1, [a])
    _group(store, 2, [b], second)
    return a, b


def _replanner(store: Store, wait_s: float = 900.0, **live: Any) -> Replanner:
    return Replanner(store, CAP, WeavePolicy(), "",
                     replace(RUNTIME_DEFAULTS, replan_interval_s=600.0, move_wait_s=wait_s),
                     lambda job: live.get(str(job)), T0)


def test_a_paying_consolidation_is_committed_and_the_emptied_group_drains_after(
        store: Store) -> None:
    a, b = _two_lone_jobs(store)
    r = _replanner(store)
    r.left(1)
    r.tick(T0 + 1)
    rows = {j: store.job(j) for j in (a, b)}
    moved = [j for j, row in rows.items() if row is not None and row.moving_from is not None]
    assert len(moved) == 1
    row = rows[moved[0]]
    assert row is not None and row.group_id == 3 - row.moving_from   # type: ignore[operator]
    assert row.reason.startswith(f"moving from group {row.moving_from} to group "
                                 f"{row.group_id}: consolidation after a departure costs")
    emptied = store.group(row.moving_from or 0)
    assert emptied is not None and not emptied.plan.members
    assert emptied.state is GroupState.ACTIVE   # its node holds the checkpoint to move
    r.tick(T0 + 2)
    assert store.group(row.moving_from or 0).state is GroupState.ACTIVE   # type: ignore[union-attr]
    store.update("job", row.job_id, moving_from=None)   # the runtime carried it out
    r.tick(T0 + 3)
    drained = store.group(emptied.group_id)
    assert drained is not None and drained.state is GroupState.DRAINING
    assert store.transitions("group", emptied.group_id)[-1].reason \
        == "a re-plan moved its members to other groups"


def test_a_move_into_a_group_that_grows_waits_keeping_its_place(store: Store) -> None:
    """A move that needs nodes weaved does not hold yet (a joins b's group on a new
    rollout node, freeing its own training node) is committed as a waiting move: the job
    keeps its place in its old group's plan (it runs there meanwhile), and that group is
    closed to newcomers; with move_wait_s = 0 it is not taken at all."""
    a, b = _two_lone_jobs(store, rollout_s=100.0)
    r = _replanner(store, wait_s=0.0)
    r.left(1)
    r.tick(T0 + 1)
    assert all(j.moving_from is None for j in store.jobs())
    r = _replanner(store)
    r.left(1)
    r.tick(T0 + 2)
    (row,) = [j for j in store.jobs() if j.moving_from is not None]   # a or b
    src, dst = row.moving_from or 0, row.group_id or 0
    assert {src, dst} == {1, 2}
    old, new = store.group(src), store.group(dst)
    assert old is not None and new is not None
    assert old.plan.job_ids == (row.job_id,) and sorted(new.plan.job_ids) == sorted((a, b))
    assert len(allocplan.pinned(new.plan)) == 2   # on a node its new group asks for
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 3)
    assert state.closed == {src} and state.job_group[str(row.job_id)] == dst
    assert src not in state.by_id   # its place there is not a member placement sees
    r.tick(T0 + 3)
    assert store.group(src).state is GroupState.ACTIVE   # type: ignore[union-attr]


def test_a_move_that_needs_the_node_its_old_group_holds_is_not_taken(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The same move on a site whose h20 pool has two nodes, both held (one by each
    group): the node it needs is free only once the job has left, so it could only be
    withdrawn; it is not taken, and the log says why."""
    _two_lone_jobs(store, rollout_s=100.0)
    r = Replanner(store, replace(CAP, rollout_pool_nodes=2), WeavePolicy(), "",
                  replace(RUNTIME_DEFAULTS, replan_interval_s=600.0), lambda job: None, T0)
    r.left(1)
    with caplog.at_level(logging.INFO, logger="weave_slurm.daemon.replanning"):
        r.tick(T0 + 1)
    assert all(j.moving_from is None for j in store.jobs())
    assert "the pools lack them while its old group holds its own: 1 rollout node(s) " \
        "where 0 are free" in caplog.text


def test_a_cooperative_job_is_never_moved(store: Store) -> None:
    _two_lone_jobs(store, spec=COOP)
    r = _replanner(store)
    r.left(1)
    r.left(2)
    r.tick(T0 + 1)
    assert all(j.moving_from is None for j in store.jobs())


def test_the_periodic_replan_waits_for_its_interval_and_for_moves_in_flight(
        store: Store) -> None:
    a, b = _two_lone_jobs(store)
    r = _replanner(store)
    r.tick(T0 + 599)
    assert all(j.moving_from is None for j in store.jobs())
    store.update("job", a, moving_from=7)   # an earlier move not carried out yet
    r.tick(T0 + 601)
    assert store.job(b).moving_from is None   # type: ignore[union-attr]
    store.update("job", a, moving_from=None)
    r.tick(T0 + 1202)
    assert sum(j.moving_from is not None for j in store.jobs()) == 1


def _waiting_out_of_three(store: Store, entrant: bool = False
                          ) -> tuple[int, int, int, int, Replanner]:
    """Jobs a, e and c on a rollout node each in active group 1 (groups of 3), b alone in
    group 2, d alone in group 4; a re-plan moves c into a new group 3 (it waits for its
    nodes there) and puts a and e on one node of group 1 (``entrant``: d joins them
    there, its move waiting for group 1's new plan). Returns a, e, c, d and the
    replanner."""
    cap = replace(CAP, max_group_size=3)
    for gid in (1, 2, 4):
        _group(store, gid, [], GroupState.FORMING)
    a, e, c = (_running(store, n, 1) for n in "aec")
    b, d = _running(store, "b", 2), _running(store, "d", 4)
    store.update("group", 1, plan=GroupPlan(3, 1, tuple(
        MemberPlan(j, (i,)) for i, j in enumerate((a, e, c)))).to_json())
    store.transition("group", 1, GroupState.ACTIVE, "held", T0)
    _group(store, 2, [b])
    _group(store, 4, [d])
    r = Replanner(store, cap, WeavePolicy(), "",
                  replace(RUNTIME_DEFAULTS, replan_interval_s=600.0),
                  lambda job: None, T0)
    groups, allocs, before, movable = r._view()
    by = {m.job.job_id: m for g in before.groups for m in g.members}
    kept = (Member(by[str(a)].job, (0,)), Member(by[str(e)].job, (0,)))
    after = ClusterState(cap, (
        Group(1, (*kept, *((Member(by[str(d)].job, (0,)),) if entrant else ())), 1, 1),
        before.by_id[2], Group(3, (Member(by[str(c)].job, (0,)),), 1, 1),
        *(() if entrant else (before.by_id[4],))), 5)
    plan = Replan(after, {str(c): 30.0, **({str(d): 30.0} if entrant else {})},
                  SimpleNamespace(efficiency_after=0.5, efficiency_before=1.0))  # type: ignore[arg-type]
    assert r._take(plan, before, groups, allocs, movable, T0 + 1, "a test re-plan")
    return a, e, c, d, r


def test_a_waiting_move_out_of_a_group_that_re_pins_the_others_defers_its_new_plan(
        store: Store) -> None:
    """The group c waits to leave runs its plan as it is meanwhile (c keeps its place,
    a and e stay on their nodes) and holds the plan the re-plan gave it (a and e on one
    node) until c is out."""
    a, e, c, _, _ = _waiting_out_of_three(store)
    row = store.job(c)
    assert row is not None and (row.group_id, row.moving_from) == (3, 1)
    old = store.group(1)
    assert old is not None
    assert [(m.job_id, m.rollout_pins) for m in old.plan.members] == \
        [(a, (0,)), (e, (1,)), (c, (2,))]
    then = old.plan.then
    assert then is not None and sorted(then.job_ids) == sorted((a, e))
    assert len(allocplan.pinned(then)) == 1 and then.rollout_nodes == 1
    assert GroupPlan.from_json(old.plan.to_json()) == old.plan   # stored as it is
    state = membership.cluster_state(replace(CAP, max_group_size=3), store.groups(),
                                     store.jobs(), 4)
    assert state.closed == {1}
    assert [m.rollout_pins for m in state.by_id[1].members] == [(0,), (1,)]


def test_a_move_into_a_group_that_waits_for_its_leaver_waits_for_its_new_plan(
        store: Store) -> None:
    """d's move into group 1 waits for group 1's new plan (c out first): d is in that
    plan only, keeps its place in group 4 (which runs on as it is) and group 1 lists it
    as moving in."""
    a, e, c, d, _ = _waiting_out_of_three(store, entrant=True)
    one, four = store.group(1), store.group(4)
    assert one is not None and four is not None
    assert one.plan.job_ids == (a, e, c) and one.plan.next_ids == (d,)
    assert one.plan.leaving_ids == (c,)
    assert four.plan.job_ids == (d,) and four.plan.then is not None \
        and not four.plan.then.members
    row = store.job(d)
    assert row is not None and (row.group_id, row.moving_from) == (1, 4)
    state = membership.cluster_state(replace(CAP, max_group_size=3), store.groups(),
                                     store.jobs(), 5)
    assert state.closed == {1, 4}


def _arrival(store: Store, name: str, spec: str = SPEC) -> int:
    return store.add_job(uid=1000, user="alice", name=name,
                         **stored(name, spec.replace("{name}", name)),
                         source=f"{name}.toml", now=T0,
                         profile=simple_profile(name, 10.0, 10, 3.0))


def _placer(store: Store, recent_jobs: int = 6) -> Placer:
    cap = replace(CAP, max_group_size=3)
    placer = Placer(store, cap, WeavePolicy(), default_site(), "", lambda s: None)
    r = Replanner(store, cap, WeavePolicy(), "",
                  replace(RUNTIME_DEFAULTS, recent_jobs=recent_jobs, consolidate=False),
                  lambda job: None, T0)
    placer.with_arrivals = r.with_arrivals
    return placer


def test_an_arrival_re_places_the_running_jobs_placed_last_where_it_pays(
        store: Store) -> None:
    """a and b run alone in groups 1 and 2; c arrives. Placed alone, c joins one of them
    and the other stays alone; placed again together (c at no charge: not started), the
    three share one group, and the one running job that moves pays for its move. The
    placement and the move are written in one transaction."""
    a, b = _two_lone_jobs(store)
    c = _arrival(store, "c")
    _placer(store).place(T0 + 1)
    row = store.job(c)
    assert row is not None and row.state is JobState.PLACED, row
    (mover,) = [j for j in store.jobs([JobState.RUNNING]) if j.moving_from is not None]
    assert mover.job_id in (a, b) and mover.group_id == row.group_id
    assert mover.reason.startswith(f"moving from group {mover.moving_from} to group "
                                   f"{row.group_id}: re-placement of job(s) ")
    assert f"with the arrival(s) {c} costs" in mover.reason
    group = store.group(row.group_id or 0)
    assert group is not None and set(group.plan.job_ids) == {a, b, c}
    assert store.transitions("job", c)[-1].reason.endswith("re-placed with recent arrivals")


def test_with_recent_jobs_0_or_a_move_in_flight_an_arrival_is_placed_alone(
        store: Store) -> None:
    a, _ = _two_lone_jobs(store)
    c = _arrival(store, "c")
    _placer(store, recent_jobs=0).place(T0 + 1)
    assert all(j.moving_from is None for j in store.jobs())
    assert store.job(c).state is JobState.PLACED   # type: ignore[union-attr]
    d = _arrival(store, "d")
    store.update("job", a, moving_from=1)   # a move in flight: one re-plan at a time
    _placer(store).place(T0 + 2)
    row = store.job(d)
    assert row is not None and row.state is JobState.PLACED
    assert [j.job_id for j in store.jobs() if j.moving_from is not None] == [a]
