"""Pooled groups (placement/pooled.py, pooled_placement.py): a rollout side of GPUs that
every member's rollout spans in turn, its width chosen by cost per unit of work."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.charge import Charge
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.decision import Admission, Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.group import Member
from weave_slurm.placement.moves import pauses
from weave_slurm.placement.pooled import (
    cost_per_work,
    efficient_width,
    fewest_gpus,
    pooled_group,
    step_gpus,
)
from weave_slurm.placement.repack import best_group

from .conftest import capacity

GPN = 8


def pooled_cap(max_group_size: int = 4, mem: float = 1e9, pool: int = 10**6):  # type: ignore[no-untyped-def]
    return replace(capacity(max_group_size, mem, pool), rollout_pooled=True)


def seven_b(job_id: str, slo: float = 2.0, **kw: float) -> JobProfile:
    """A 7B_8k job of the production trace: 133.8 s rollout on one h20 node, 112.8 s
    training, 47.8 s weights-bound floor."""
    p = simple_profile(job_id, 133.8, 112.8, slo, rollout_state_gib=kw.pop("state", 256.0))
    return replace(p, rollout_floor_s=47.8, **kw)  # type: ignore[arg-type]


def members(*jobs: JobProfile) -> tuple[Member, ...]:
    return tuple(Member(j, (0,)) for j in jobs)


def test_a_pool_spreads_each_rollout_over_its_gpus_one_member_at_a_time() -> None:
    a, b = seven_b("a"), seven_b("b")
    narrow = pooled_group(1, members(a, b), 8, GPN)
    # one node's worth: the two rollouts one after the other (267.6 s) set the period
    assert narrow.rollout_held_nodes == 1.0
    assert narrow.period_s == pytest.approx(2 * 133.8)
    wide = pooled_group(1, members(a, b), 10, GPN)
    # 10 GPUs: each rollout 133.8 x 8/10 = 107.04 s; the training node binds (225.6 s)
    assert wide.rollout_held_nodes == 1.25
    assert wide.rollout_factors == (0.8, 0.8)
    assert wide.period_s == pytest.approx(2 * 112.8)
    assert wide.schedule.rollout_busy == pytest.approx(2 * 107.04 / 225.6)
    assert wide.schedule.train_busy == pytest.approx(1.0)
    # no wider than the floor: 64 GPUs do not beat 47.8 s a rollout
    assert pooled_group(1, members(a), 64, GPN).rollout_factors == (pytest.approx(47.8 / 133.8),)


def test_each_node_of_a_pool_holds_every_members_state() -> None:
    a, b = seven_b("a", state=600.0), seven_b("b", state=600.0)
    g = pooled_group(1, members(a, b), 12, GPN)
    assert g.rollout_mem_used_gib == (1200.0,)
    assert not pooled_cap(mem=1100.0).fits(g)
    assert pooled_cap(mem=1300.0).fits(g)


def test_a_pool_keeps_to_the_turn_order_so_turns_may_share_it() -> None:
    long = seven_b("long")
    short = simple_profile("short", 40.0, 30.0, 3.0)
    g = pooled_group(1, (Member(long, (0,)), Member(short, (0,), 3)), 8, GPN)
    assert not g.turns_apart   # a pinned group could not plan this
    assert pooled_cap().fits(g)


jobs_st = st.lists(st.builds(
    lambda r, t, slo, floor, two: replace(
        simple_profile("j", r, t, slo, rollout_nodes=2 if two else 1),
        rollout_floor_s=floor * r, rollout_replica_gpus=2 if two else 1),
    st.floats(25, 600), st.floats(25, 600), st.floats(1.0, 2.0), st.floats(0, 0.6),
    st.booleans()), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_st)
def test_the_bisection_finds_the_fewest_feasible_gpus(jobs: list[JobProfile]) -> None:
    ms = tuple(Member(j.with_id(f"j{i}"), (0,)) for i, j in enumerate(jobs))
    cap = pooled_cap()
    step = step_gpus([m.job for m in ms])
    scan = next((w for w in range(step, 97, step)
                 if cap.fits(pooled_group(1, ms, w, GPN))), None)
    found = fewest_gpus(1, ms, cap, 1, 96)
    assert (found.pool_gpus if found else None) == scan
    best = efficient_width(1, ms, cap, 1, 96)
    assert (best is None) == (scan is None)
    if best is not None and found is not None:
        assert best.pool_gpus % step == 0 and cap.fits(best)
        assert cost_per_work(best, cap) <= cost_per_work(found, cap) + 1e-9
        widest = pooled_group(1, ms, step * (96 // step), GPN)
        assert cost_per_work(best, cap) <= cost_per_work(widest, cap) + 1e-9


def test_the_width_that_delivers_the_work_cheapest_is_where_training_binds() -> None:
    a, b = seven_b("a"), seven_b("b")
    cap = pooled_cap()
    # 5 GPUs already meet both SLOs (2x), stretching the period to 428 s; 10 fill the
    # training node and cost the least per unit of work
    assert fewest_gpus(1, members(a, b), cap, 1, 64).pool_gpus == 5  # type: ignore[union-attr]
    g = efficient_width(1, members(a, b), cap, 1, 64)
    assert g is not None and g.pool_gpus == 10


def test_arrivals_share_pools_on_their_cheapest_widths_and_departures_narrow_them() -> None:
    cap = pooled_cap()
    policy = WeavePolicy()
    state = ClusterState(cap)
    first = policy.place(state, seven_b("a"))
    assert isinstance(first, Placement) and first.admission is Admission.NEW_GROUP
    # alone, its training node waits for its rollout: GPUs that shorten it pay
    g = first.group
    assert g.pooled and g.pool_gpus > 8
    own = pooled_group(1, members(seven_b("a")), 8, GPN)   # its own 8 GPUs
    assert cost_per_work(g, cap) < cost_per_work(own, cap)
    assert first.cost_delta_per_hour == pytest.approx(1.0 + g.pool_gpus / 24)
    state = apply(state, first)
    second = policy.place(state, seven_b("b"))
    assert isinstance(second, Placement) and second.group_id == 1
    pair = second.group
    assert pair.job_ids in (("a", "b"), ("b", "a"))
    # the pair fills its training node; it costs less per unit of work than two pools
    assert pair.schedule.train_busy == pytest.approx(1.0)
    assert cost_per_work(pair, cap) < 2 * cost_per_work(g, cap)
    state = apply(state, second)
    assert state.rollout_nodes_used == pytest.approx(pair.pool_gpus / GPN)
    # b leaves: a's pool takes the width that suits a alone, no wider than it held
    left = depart(state, "b")
    alone = left.by_id[1]
    suits = efficient_width(1, members(seven_b("a")), cap, 1, pair.pool_gpus)
    assert suits is not None and alone.job_ids == ("a",)
    assert alone.pool_gpus == suits.pool_gpus <= pair.pool_gpus



def test_a_member_whose_pool_changes_width_pays_a_re_pin() -> None:
    cap = pooled_cap()
    a, b = seven_b("a"), seven_b("b")
    before = ClusterState(cap, (pooled_group(1, members(a, b), 10, GPN),), 2)
    same = ClusterState(cap, (pooled_group(1, members(a), 10, GPN),), 2)
    narrower = ClusterState(cap, (pooled_group(1, members(a), 8, GPN),), 2)
    assert pauses(before, same) == {}
    assert set(pauses(before, narrower)) == {"a"}
    assert pauses(before, narrower)["a"] == pytest.approx(cap.moves.repin_s(256.0))


def test_a_pool_grows_by_whole_engine_replicas() -> None:
    cap = pooled_cap()
    big = replace(simple_profile("big", 267.6, 271.3, 2.0, rollout_nodes=2),
                  rollout_replica_gpus=2, rollout_floor_s=109.2)
    assert step_gpus([big, seven_b("a")]) == 2
    g = efficient_width(1, members(big, seven_b("a")), cap, 1, 64)
    assert g is not None and g.pool_gpus % 2 == 0
    odd = pooled_group(1, members(seven_b("b")), 9, GPN)
    state = ClusterState(cap, (odd,), 2)
    d = WeavePolicy().place(state, big)
    assert isinstance(d, Placement)
    assert d.group.pool_gpus % 2 == 0   # never on the odd pool as it is


def test_jobs_of_other_charges_never_share_a_pool() -> None:
    cap = pooled_cap()
    a = seven_b("a")
    b = replace(seven_b("b"), charge=Charge(account="other"))
    state = apply(ClusterState(cap), WeavePolicy().place(ClusterState(cap), a))  # type: ignore[arg-type]
    d = WeavePolicy().place(state, b)
    assert isinstance(d, Placement) and d.admission is Admission.NEW_GROUP


def test_a_batch_re_plans_into_pools_and_the_optimum_uses_them() -> None:
    cap = pooled_cap()
    jobs = [seven_b(f"j{i}") for i in range(3)]
    g = best_group(jobs, cap, group_id=7)
    assert g is not None and g.pooled and g.group_id == 7
    assert cap.fits(g)
    assert fewest_gpus(7, g.members, cap, 1, 64).pool_gpus == g.pool_gpus  # type: ignore[union-attr]


def test_a_job_whose_rollout_does_not_widen_keeps_to_pinned_groups() -> None:
    cap = pooled_cap()
    policy = WeavePolicy()
    fixed = replace(simple_profile("fixed", 133.8, 112.8, 2.0), rollout_floor_s=133.8)
    state = ClusterState(cap)
    d = policy.place(state, fixed)
    assert isinstance(d, Placement) and not d.group.pooled
    assert d.group.rollout_nodes == 1 and d.group.members[0].rollout_pins == (0,)
    state = apply(state, d)
    d2 = policy.place(state, seven_b("a"))   # a job that widens: a pool of its own
    assert isinstance(d2, Placement) and d2.group.pooled and d2.group.group_id == 2
    state = apply(state, d2)
    d3 = policy.place(state, replace(fixed, job_id="fixed2"))   # never into the pool
    assert isinstance(d3, Placement) and not d3.group.pooled
