"""Charged re-planning: consolidation, re-placing recent arrivals, periodic re-plans."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.consolidate import consolidation
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.group import Group, Member, colocated_group, with_profile
from weave_slurm.placement.replan import (
    DEFAULT_HORIZON_S,
    MAX_HORIZON_S,
    Replan,
    deferring,
    horizon,
    needs_nodes,
    regroup_all,
    replace_jobs,
    replan_worst,
    short_of_nodes,
    slo_allows,
    waiting_moves,
    waiting_refusal,
    worst_groups,
)

from .conftest import capacity, job_lists
from .test_engine import MEM, assert_feasible


def online(jobs: list[JobProfile], mem: float = MEM) -> ClusterState:
    state = ClusterState(capacity(max_group_size=4, mem=mem))
    policy = WeavePolicy()
    for job in jobs:
        decision = policy.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
    return state


def assert_pays(before: ClusterState, plan: Replan) -> None:
    after = plan.state
    assert_feasible(after)
    assert sorted(after.job_group) == sorted(before.job_group)
    assert after.cost_per_hour <= before.cost_per_hour + 1e-9
    b = plan.books
    assert b.efficiency_after < b.efficiency_before
    assert b.cost_before == pytest.approx(before.cost_per_hour)
    assert b.work_after == pytest.approx(after.work_per_hour)
    assert set(plan.pauses) <= set(before.job_group)
    assert all(p > 0 for p in plan.pauses.values())


@settings(max_examples=60, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=10), data=st.data())
def test_consolidation_never_costs_more_nor_delivers_work_dearer(
        jobs: list[JobProfile], data: st.DataObject) -> None:
    state = online(jobs)
    leaving = data.draw(st.sampled_from(sorted(state.job_group)))
    gid = state.job_group[leaving]
    state = depart(state, leaving)
    plan = consolidation(WeavePolicy(), state, gid)
    if plan is not None:
        assert_pays(state, plan)


@settings(max_examples=40, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=10), recent=st.integers(1, 6),
       remaining=st.floats(60.0, 200_000.0))
def test_re_placing_recent_arrivals_and_the_worst_groups_pays_when_taken(
        jobs: list[JobProfile], recent: int, remaining: float) -> None:
    state = online(jobs)
    left = dict.fromkeys(state.job_group, remaining)
    for plan in (replace_jobs(WeavePolicy(), state, [j.job_id for j in jobs[-recent:]], left),
                 replan_worst(WeavePolicy(), state, 3, left),
                 regroup_all(WeavePolicy(), state, left)):
        if plan is not None:
            assert_pays(state, plan)
            assert slo_allows(plan.state, plan.pauses, left)


def test_re_placing_recent_arrivals_undoes_a_pairing_the_greedy_could_not_foresee() -> None:
    # In arrival order j0 and j1 share a group (two rollout nodes) and j2 opens its own:
    # 1 + 2/3 + 4/3 = 3.0 per hour. Placed again together, j1 shares j2's rollout node
    # and j0 runs alone: 8/3. Only j0 moves (j1 stays with its group's nodes, j2 has not
    # started: free).
    j0 = simple_profile("j0", 335, 191, 1.13)
    j1 = simple_profile("j1", 401, 146, 1.33)
    j2 = simple_profile("j2", 253, 394, 1.99)
    state = online([j0, j1, j2], mem=1e9)
    assert state.cost_per_hour == pytest.approx(3.0)
    plan = replace_jobs(WeavePolicy(), state, ["j0", "j1", "j2"], free={"j2"})
    assert plan is not None
    assert_pays(state, plan)
    assert plan.state.cost_per_hour == pytest.approx(8 / 3)
    assert plan.moved == ("j0",)
    assert plan.pauses["j0"] == pytest.approx(state.capacity.moves.restart_s)


def test_a_pause_needs_slack_to_absorb_it_before_the_job_ends() -> None:
    job = simple_profile("a", 100.0, 100.0, 1.1)  # budget 220 s
    cap = capacity()
    s = ClusterState(cap, (Group(1, (Member(job, (0,)),), 1, 1),), 2)  # period 200 s
    # 10 % slack: a 30 s pause is absorbed within 300 s of remaining time, not 200 s.
    assert slo_allows(s, {"a": 30.0}, {"a": 300.0})
    assert not slo_allows(s, {"a": 30.0}, {"a": 200.0})
    assert not slo_allows(s, {"a": 30.0}, {"a": 0.0})
    tight = replace(job, slo=1.0)
    s = ClusterState(cap, (Group(1, (Member(tight, (0,)),), 1, 1),), 2)
    assert not slo_allows(s, {"a": 1.0}, {"a": 1e6})
    assert slo_allows(s, {}, None)


def test_horizon_is_the_shortest_remaining_life_of_the_jobs_moved_capped() -> None:
    s = ClusterState(capacity(), (Group(1, (Member(simple_profile("a", 1, 1, 2), (0,)),
                                            Member(simple_profile("b", 1, 1, 2), (1,))), 2, 1),
                                  ), 2)
    assert horizon(s, {"a": 30.0, "b": 30.0}, {"a": 500.0, "b": 900.0}) == 500.0
    assert horizon(s, {"a": 30.0}, None) == DEFAULT_HORIZON_S
    assert horizon(s, {"a": 30.0}, {"a": math.inf}) == DEFAULT_HORIZON_S
    assert horizon(s, {"a": 30.0}, {"a": 1e9}) == MAX_HORIZON_S
    assert horizon(s, {}, None) == DEFAULT_HORIZON_S


def test_with_profile_replans_one_member_on_its_measured_times_in_place() -> None:
    a, b = simple_profile("a", 100, 100, 2.0), simple_profile("b", 50, 50, 2.0)
    g = Group(3, (Member(a, (0,)), Member(b, (0,))), 1, 1)
    slower = replace(a, rollout_max_s=150.0, rollout_mean_s=150.0)
    h = with_profile(g, slower)
    assert [m.job for m in h.members] == [slower, b]
    assert [m.rollout_pins for m in h.members] == [(0,), (0,)]
    assert (h.group_id, h.rollout_nodes, h.train_nodes) == (3, 1, 1)
    assert h.schedule.period_s > g.schedule.period_s


def test_needs_nodes_names_the_groups_a_move_enters_that_are_new_or_grow() -> None:
    a, b, c = (simple_profile(j, 100, 100, 2.0) for j in "abc")
    cap = capacity(max_group_size=4)
    before = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(c, (0,))), 1, 1),
                                Group(2, (Member(b, (0,)),), 1, 1)), 3)
    onto_held = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(b, (0,)),
                                             Member(c, (0,))), 1, 1),), 3)
    grown = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(b, (1,)),
                                         Member(c, (0,))), 2, 1),), 3)
    formed = ClusterState(cap, (Group(1, (Member(a, (0,)),), 1, 1),
                                Group(2, (Member(b, (0,)),), 1, 1),
                                Group(3, (Member(c, (0,)),), 1, 1)), 4)
    shrunk = ClusterState(cap, (Group(1, (Member(a, (0,)),), 1, 1),
                                Group(2, (Member(b, (0,)), Member(c, (0,))), 1, 1)), 3)
    assert needs_nodes(before, onto_held) == []
    assert needs_nodes(before, grown) == [1]
    assert needs_nodes(before, formed) == [3]   # c moves into a group formed for it
    assert needs_nodes(before, shrunk) == []    # c joins b on the nodes b's group holds
    assert needs_nodes(before, before) == []


def test_a_waiting_move_needs_free_nodes_besides_those_its_old_group_holds() -> None:
    """short_of_nodes / waiting_refusal: c's move into a new group needs a rollout and a
    training node while group 1 still holds its own (c runs there until it has moved)."""
    a, b, c = (simple_profile(j, 100, 100, 2.0) for j in "abc")

    def states(pool: int) -> tuple[ClusterState, ClusterState]:
        cap = replace(capacity(max_group_size=4), rollout_pool_nodes=pool,
                      train_pool_nodes=pool)
        before = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(c, (1,))), 2, 1),
                                    Group(2, (Member(b, (0,)),), 1, 1)), 3)
        after = ClusterState(cap, (Group(1, (Member(a, (0,)),), 1, 1),
                                   Group(2, (Member(b, (0,)),), 1, 1),
                                   Group(3, (Member(c, (0,)),), 1, 1)), 4)
        return before, after
    before, after = states(pool=4)   # one rollout and two training nodes free
    assert short_of_nodes(before, after, [3]) is None
    assert waiting_refusal(before, after) is None
    before, after = states(pool=3)   # every rollout node held, one training node free
    assert short_of_nodes(before, after, [3]) == "1 rollout node(s) where 0 are free"
    assert waiting_moves(before, after) == {"c"}
    assert waiting_refusal(before, after) == ("the pools lack them while its old group holds "
                                             "its own: 1 rollout node(s) where 0 are free")


def test_a_move_may_wait_for_nodes_only_where_its_old_group_needs_nothing_new() -> None:
    """waiting_moves: the jobs whose move needs nodes, or None where the group such a
    move leaves would take a job or need a node it does not hold; its other members may
    be re-pinned on its nodes or take other turns (it takes that plan once the waiting
    job is out)."""
    a, b, c, d = (simple_profile(j, 100, 100, 2.0) for j in "abcd")
    cap = capacity(max_group_size=4)
    before = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(c, (1,))), 2, 1),
                                Group(2, (Member(b, (0,)),), 1, 1),
                                Group(4, (Member(d, (0,)),), 1, 1)), 5)
    # c leaves group 1 for a new group 3; a stays on its node: c's move waits
    formed = ClusterState(cap, (Group(1, (Member(a, (0,)),), 1, 1),
                                Group(2, (Member(b, (0,)),), 1, 1),
                                Group(3, (Member(c, (0,)),), 1, 1),
                                Group(4, (Member(d, (0,)),), 1, 1)), 5)
    assert waiting_moves(before, formed) == {"c"}
    # onto held nodes only: nothing waits, whatever the old groups become
    onto_held = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(c, (1,))), 2, 1),
                                   Group(2, (Member(b, (0,)), Member(d, (0,))), 1, 1)), 5)
    assert waiting_moves(before, onto_held) == frozenset()
    # the group c waits to leave takes d: d's move waits for that (a chain of waits)
    entered = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(d, (0,))), 1, 1),
                                 Group(2, (Member(b, (0,)),), 1, 1),
                                 Group(3, (Member(c, (0,)),), 1, 1)), 5)
    assert waiting_moves(before, entered) == {"c", "d"}
    assert deferring(before, entered, {"c", "d"}) == {1, 4}
    # ... but not where two groups would wait for each other: a waits to go to group 2,
    # which waits for b, who waits for group 1, which waits for c's new group
    swapped = ClusterState(cap, (Group(1, (Member(b, (0,)),), 1, 1),
                                 Group(2, (Member(a, (0,)),), 1, 1),
                                 Group(3, (Member(c, (0,)),), 1, 1),
                                 Group(4, (Member(d, (0,)),), 1, 1)), 5)
    assert waiting_moves(before, swapped) is None
    # the members the group keeps change once c is out: a takes two turns, or a and e
    # come to share a node: c's move waits all the same
    more_turns = ClusterState(cap, (Group(1, (Member(a, (0,), 2),), 1, 1),
                                    Group(2, (Member(b, (0,)),), 1, 1),
                                    Group(3, (Member(c, (0,)),), 1, 1),
                                    Group(4, (Member(d, (0,)),), 1, 1)), 5)
    assert waiting_moves(before, more_turns) == {"c"}
    e = simple_profile("e", 100, 100, 2.0)
    three = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(e, (1,)),
                                         Member(c, (2,))), 3, 1),), 2)
    shared = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(e, (0,))), 1, 1),
                                Group(2, (Member(c, (0,)),), 1, 1)), 3)
    apart = ClusterState(cap, (Group(1, (Member(e, (0,)), Member(a, (1,))), 2, 1),
                               Group(2, (Member(c, (0,)),), 1, 1)), 3)
    assert waiting_moves(three, shared) == {"c"}
    assert waiting_moves(three, apart) == {"c"}
    # ... but not where its new plan needs a node or a training node it does not hold
    wider = ClusterState(cap, (Group(1, (Member(a, (0, 1)), Member(e, (2, 3))), 4, 1),
                               Group(2, (Member(c, (0,)),), 1, 1)), 3)
    assert waiting_moves(three, wider) is None
    trains = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(e, (1,))), 2, 2),
                                Group(2, (Member(c, (0,)),), 1, 1)), 3)
    assert waiting_moves(three, trains) is None
    # a group the runtime names (not active yet) makes a move onto it wait too
    assert waiting_moves(before, onto_held, {2}) == {"d"}
    # a whole group moving into a grown one: its old group is simply gone
    grown = ClusterState(cap, (Group(1, (Member(a, (0,)), Member(c, (1,))), 2, 1),
                               Group(2, (Member(b, (0,)), Member(d, (1,))), 2, 1)), 5)
    assert waiting_moves(before, grown) == {"d"}


def test_the_hourly_re_plan_regroups_co_located_jobs_a_group_would_beat() -> None:
    # Two 300 + 300 s jobs co-located on an h800 node each: 2 per hour for two
    # iterations per 600 s. On one h800 and one h20 node (one rollout node each:
    # 5/3 per hour) they run at the same period: cheaper per hour and per unit of work.
    # The re-plan of the least efficient groups picks co-located groups too (it left
    # them out: a co-located job stayed so until a newcomer joined it).
    cap = replace(capacity(max_group_size=3), colocation=True)
    jobs = [simple_profile(f"c{i}", 300.0, 300.0, 1.5) for i in range(2)]
    state = ClusterState(cap, tuple(colocated_group(i + 1, j) for i, j in enumerate(jobs)), 3)
    assert {g.group_id for g in worst_groups(state, 8)} == {1, 2}
    assert worst_groups(replace(state, capacity=replace(cap, colocation=False)), 8) == []
    plan = replan_worst(WeavePolicy(), state, 8, dict.fromkeys(state.job_group, 86_400.0))
    assert plan is not None
    assert_pays(state, plan)
    assert not any(g.colocated for g in plan.state.groups)
    assert plan.state.cost_per_hour < state.cost_per_hour
