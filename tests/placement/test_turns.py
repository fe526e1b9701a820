"""Members that take several turns per meta-iteration (placement/group.py ``Member.turns``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.cluster_state import ClusterState, depart
from weave_slurm.placement.cyclic import cyclic_period, slot_order
from weave_slurm.placement.group import Group, Member, turns_for
from weave_slurm.placement.repack import best_group, turn_sets
from weave_slurm.sim.execution import GroupExecution

from .conftest import capacity

# A long job and a short one, each on its own rollout node, sharing the training node.
LONG = simple_profile("long", rollout_s=100, train_s=40, slo=1.5)
SHORT = simple_profile("short", rollout_s=20, train_s=20, slo=1.2)


def _pair(turns: int) -> Group:
    return Group(0, (Member(LONG, (0,)), Member(SHORT, (1,), turns)), 2, 1)


def test_slot_order_spreads_a_members_turns_over_the_cycle() -> None:
    assert slot_order([1, 1, 1]) == (0, 1, 2)
    assert slot_order([1, 2]) == (1, 0, 1)
    assert slot_order([1, 3]) == (1, 0, 1, 1)
    assert slot_order([2, 4]) == slot_order([1, 2]) * 2   # the same cycle twice


def test_period_with_turns_hand_computed() -> None:
    # Turns (1, 2), slots short, long, short: the short job's second training waits
    # for the long one's (ends at 140), so a meta-iteration is the long job's own
    # 140 s cycle and the short job runs twice in it.
    args = ([100, 20], [40, 20], [0, 0], [(0,), (1,)], [(0,), (0,)])
    assert cyclic_period(*args) == pytest.approx(140)
    assert cyclic_period(*args, turns=[1, 2]) == pytest.approx(140)
    # Three turns still fit in the long job's rollout: 140 s, 46.7 s per short step.
    assert cyclic_period(*args, turns=[1, 3]) == pytest.approx(140)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 600), st.floats(1, 600), st.floats(0, 30)),
                min_size=1, max_size=4),
       st.booleans())
def test_one_turn_each_is_the_plain_schedule(jobs: list[tuple[float, float, float]],
                                             share: bool) -> None:
    r, t, s = (list(x) for x in zip(*jobs, strict=True))
    pins = [(0,) if share else (i,) for i in range(len(jobs))]
    train = [(0,)] * len(jobs)
    plain = cyclic_period(r, t, s, pins, train)
    assert cyclic_period(r, t, s, pins, train, turns=[1] * len(jobs)) == pytest.approx(plain)
    # Doubling every member's turns is the same cycle twice.
    assert cyclic_period(r, t, s, pins, train, turns=[2] * len(jobs)) == \
        pytest.approx(2 * plain, rel=1e-6)


def test_turns_count_in_a_groups_loads_slowdowns_and_budgets() -> None:
    g = _pair(3)
    assert g.turns == (1, 3)
    assert g.train_load_s == pytest.approx(40 + 3 * 20)
    assert g.rollout_load_s == pytest.approx((100, 60))
    assert g.min_budget_s == pytest.approx(min(1.5 * 140, 3 * 1.2 * 40))
    assert g.schedule.period_s == pytest.approx(140)
    assert g.schedule.slowdowns == pytest.approx((1.0, 140 / 120))
    # Busy time counts every turn: the short job trains 3 x 20 s of the 140 s.
    assert g.schedule.train_busy == pytest.approx((40 + 60) / 140)


def test_a_short_job_fits_its_slo_beside_a_long_one_only_with_turns() -> None:
    cap = capacity()
    assert not cap.fits(_pair(1))     # once per 140 s cycle: 3.5x its 40 s step
    assert cap.fits(_pair(3))         # 46.7 s a step: 1.17x, within 1.2
    assert turns_for(140, SHORT) == 3
    assert turn_sets([LONG, SHORT]) == ((1, 3), (1, 1))
    g = best_group([LONG, SHORT], cap)
    assert g is not None and g.rollout_nodes == 2
    assert {m.job.job_id: m.turns for m in g.members} == {"long": 1, "short": 3}


def test_a_member_with_turns_has_its_rollout_nodes_to_itself() -> None:
    # The runtime's rollout nodes serve whoever is ready, so turns are planned only on
    # a rollout node with no other member.
    shared = Group(0, (Member(LONG, (0,)), Member(SHORT, (0,), 3)), 1, 1)
    assert not shared.turns_apart and not capacity().fits(shared)
    assert _pair(3).turns_apart


def test_the_runtimes_order_gives_the_short_job_its_turns() -> None:
    # The event-level run orders members as the live runtime does: the short job's
    # measured step is no longer than planned.
    g = _pair(3)
    res = GroupExecution(g, keep_records=False).run(meta_iterations=60)
    assert res.steady_period_s("short") <= g.schedule.period_s / 3 * (1 + 1e-6)
    assert res.steady_period_s("long") <= g.schedule.period_s * (1 + 1e-6)


def test_training_keeps_to_the_turn_order_when_others_contend_for_it() -> None:
    # Two 32k-token jobs share a rollout node and the training node with an 8k job
    # taking three turns (a group a replay of wild.trace formed). Work-conserving, the
    # long jobs' trainings would go first whenever ready and the short job would get
    # two turns per cycle (888 s a step, 1.30x its budget); in turn order it gets the
    # three it was planned with.
    a, b = (simple_profile(n, rollout_s=888, train_s=560, slo=1.96) for n in ("a", "b"))
    s = simple_profile("s", rollout_s=310, train_s=120, slo=1.59)
    g = Group(0, (Member(a, (0,)), Member(s, (1,), 3), Member(b, (0,))), 2, 1)
    assert capacity().fits(g)
    res = GroupExecution(g, keep_records=False).run(meta_iterations=40)
    for job, turns in (("a", 1), ("s", 3), ("b", 1)):
        assert res.steady_period_s(job) == pytest.approx(g.schedule.period_s / turns,
                                                          rel=1e-6)
    assert g.schedule.period_s / 3 <= s.budget_s


def test_a_member_left_alone_takes_one_turn_again() -> None:
    state = ClusterState(capacity(), (_pair(3),), 1)
    after = depart(state, "long")
    (group,) = after.groups
    assert group.job_ids == ("short",) and group.turns == (1,)
