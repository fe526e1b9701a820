from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.baselines import POLICIES, make_policy
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.decision import Admission, Placement, Refusal
from weave_slurm.placement.engine import WeavePolicy, _placements_in

from .conftest import capacity, job_lists

MEM = 1200.0  # GiB per node: a few jobs' state fits, not all


def assert_feasible(state: ClusterState) -> None:
    cap = state.capacity
    seen: set[str] = set()
    for g in state.groups:
        assert g.size <= cap.max_group_size
        assert g.feasible(cap.rollout_mem_gib, cap.train_mem_gib), g
        for m in g.members:
            assert all(0 <= p < g.rollout_nodes for p in m.rollout_pins)
            assert len(set(m.rollout_pins)) == m.job.rollout_nodes
            assert m.job.job_id not in seen
            seen.add(m.job.job_id)
    assert state.rollout_nodes_used <= cap.rollout_pool_nodes
    assert state.train_nodes_used <= cap.train_pool_nodes


@settings(max_examples=120, deadline=None)
@given(jobs=job_lists(), policy=st.sampled_from(POLICIES), data=st.data())
def test_every_placement_keeps_every_slo_and_memory_limit(
        jobs: list[JobProfile], policy: str, data: st.DataObject) -> None:
    state = ClusterState(capacity(max_group_size=4, mem=MEM, pool=12))
    pol = make_policy(policy, seed=3)
    for job in jobs:
        decision = pol.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
            if policy != "colocated":
                assert_feasible(state)
        if state.jobs and data.draw(st.booleans()):
            leaving = data.draw(st.sampled_from(sorted(state.job_group)))
            state = depart(state, leaving)
            if policy != "colocated":
                assert_feasible(state)


@settings(max_examples=60, deadline=None)
@given(jobs=job_lists(max_size=10))
def test_placement_is_deterministic(jobs: list[JobProfile]) -> None:
    cap = capacity(mem=MEM)
    a = place_batch(WeavePolicy(), ClusterState(cap), jobs)
    b = place_batch(WeavePolicy(), ClusterState(cap), list(jobs))
    assert a.decisions == b.decisions
    assert a.state.groups == b.state.groups


@settings(max_examples=80, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=8), data=st.data())
def test_pruning_never_hides_a_feasible_option(jobs: list[JobProfile],
                                               data: st.DataObject) -> None:
    """Whatever the O(1) pre-check rejects, the detailed check rejects too."""
    cap = capacity(max_group_size=4, mem=MEM)
    state = place_batch(WeavePolicy(), ClusterState(cap), jobs[:-1]).state
    newcomer = jobs[-1].with_id("new")
    decision = WeavePolicy().place(state, newcomer)
    found_by_engine = (isinstance(decision, Placement)
                       and decision.admission is not Admission.NEW_GROUP)
    exhaustive = [p for g in state.groups if g.size < cap.max_group_size
                  for p in _placements_in(g, newcomer, cap, 10**6)]
    if exhaustive:
        assert found_by_engine
        best = min(p.cost_delta_per_hour for p in exhaustive)
        assert decision.cost_delta_per_hour <= best + 1e-9  # type: ignore[union-attr]


def test_direct_packing_is_preferred_and_fills_idle_slots() -> None:
    cap = capacity()
    state = ClusterState(cap)
    pol = WeavePolicy()
    # A rollout-heavy and a training-heavy job complement each other.
    a = simple_profile("a", rollout_s=300, train_s=60, slo=1.3)
    b = simple_profile("b", rollout_s=60, train_s=250, slo=1.3)
    state = apply(state, pol.place(state, a))  # type: ignore[arg-type]
    d = pol.place(state, b)
    assert isinstance(d, Placement)
    assert d.admission is Admission.DIRECT and d.cost_delta_per_hour == 0
    assert d.group.schedule.max_slowdown <= 1.3


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_places_a_job_into_a_closed_group(name: str) -> None:
    """ClusterState.closed: a group a move waits to leave takes no newcomer (its nodes
    still count as used)."""
    cap = capacity()
    a = simple_profile("a", rollout_s=300, train_s=60, slo=1.3)
    b = simple_profile("b", rollout_s=60, train_s=250, slo=1.3)
    state = apply(ClusterState(cap), WeavePolicy().place(ClusterState(cap), a))  # type: ignore[arg-type]
    closed = replace(state, closed=frozenset({state.groups[0].group_id}))
    d = make_policy(name, 1).place(closed, b)
    assert isinstance(d, Placement) and d.group.group_id != state.groups[0].group_id
    assert d.admission is Admission.NEW_GROUP or name == "colocated"


def test_rollout_scaling_when_rollout_node_is_saturated() -> None:
    cap = capacity()
    state = ClusterState(cap)
    pol = WeavePolicy()
    a = simple_profile("a", rollout_s=300, train_s=50, slo=1.2)
    b = simple_profile("b", rollout_s=300, train_s=50, slo=1.2)
    state = apply(state, pol.place(state, a))  # type: ignore[arg-type]
    d = pol.place(state, b)
    assert isinstance(d, Placement) and d.admission is Admission.SCALE_ROLLOUT
    assert d.added_rollout_nodes == 1 and d.cost_delta_per_hour == pytest.approx(1 / 3)


def test_refusals_carry_reasons_and_say_whether_to_retry() -> None:
    cap = capacity(mem=500, pool=1)
    pol = WeavePolicy()
    huge = simple_profile("huge", 100, 100, 1.5, rollout_state_gib=800)
    never = pol.place(ClusterState(cap), huge)
    assert isinstance(never, Refusal) and not never.retry
    assert "exceeds the rollout nodes' host memory (500 GiB)" in never.message()
    state = apply(ClusterState(cap), pol.place(ClusterState(cap),  # type: ignore[arg-type]
                                                   simple_profile("a", 100, 100, 1.0)))
    # r = t = 100 would pipeline perfectly with "a" at slowdown 1.0; t = 150 cannot.
    full = pol.place(state, simple_profile("b", 100, 150, 1.0))
    assert isinstance(full, Refusal) and full.retry
    assert "0 rollout and 0 training nodes are free" in full.message()


def test_departure_releases_nodes_and_dissolves_empty_groups() -> None:
    cap = capacity()
    jobs = [simple_profile(f"j{i}", 300, 50, 1.2) for i in range(3)]
    state = place_batch(WeavePolicy(), ClusterState(cap), jobs).state
    assert len(state.groups) == 1 and state.rollout_nodes_used == 3
    state = depart(state, "j1")
    assert state.rollout_nodes_used == 2 and state.groups[0].job_ids == ("j0", "j2")
    state = depart(depart(state, "j0"), "j2")
    assert state.groups == ()


def test_departure_compacts_rollout_nodes_when_load_allows() -> None:
    cap = capacity()
    state = ClusterState(cap)
    pol = WeavePolicy(repack=False)
    # c's long rollout forces a node of its own; once c leaves, a and b can share.
    for job in (simple_profile("a", 100, 60, 2.0), simple_profile("c", 500, 50, 1.05),
                simple_profile("b", 100, 60, 2.0)):
        state = apply(state, pol.place(state, job))  # type: ignore[arg-type]
    before = state.rollout_nodes_used
    after = depart(state, "c")
    assert after.rollout_nodes_used < before
    assert_feasible(after)


def test_isolated_and_colocated_baselines() -> None:
    cap = capacity()
    jobs = [simple_profile(f"j{i}", 100, 100, 1.5, colo_iter_s=180) for i in range(4)]
    iso = place_batch(make_policy("isolated"), ClusterState(cap), jobs).state
    assert len(iso.groups) == 4 and iso.rollout_nodes_used == 4
    colo = place_batch(make_policy("colocated"), ClusterState(cap), jobs).state
    assert colo.rollout_nodes_used == 0 and colo.train_nodes_used == 4
    assert colo.groups[0].schedule.period_s == 180
    weave = place_batch(make_policy("weave"), ClusterState(cap), jobs).state
    assert weave.cost_per_hour < iso.cost_per_hour


def test_placement_speed_is_not_quadratic_in_groups() -> None:
    """Structural check (not a timing): the pre-check prunes full and saturated groups."""
    rng = random.Random(4)
    cap = capacity()
    jobs = [simple_profile(f"j{i}", rng.uniform(25, 600), rng.uniform(25, 600),
                           rng.uniform(1.1, 2)) for i in range(300)]
    state = place_batch(WeavePolicy(), ClusterState(cap), jobs, ordered=False).state
    from weave_slurm.placement.engine import may_fit

    newcomer = simple_profile("x", 300, 300, 1.5)
    survivors = [g for g in state.groups if may_fit(g, newcomer, cap, 10**6)]
    assert len(survivors) < len(state.groups) / 4
