"""Bounded-staleness members (issue 9): schedules, solo times, and packing examples."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.config.job import parse_job
from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import simple_profile, solo_period
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.cyclic import cyclic_period, cyclic_timeline
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.engine import WeavePolicy

from .conftest import capacity

durations = st.floats(min_value=5, max_value=500)


@settings(max_examples=200, deadline=None)
@given(r=durations, t=durations, s=st.floats(0, 30), k=st.integers(0, 3))
def test_solo_period_matches_the_recurrence(r: float, t: float, s: float, k: int) -> None:
    assert cyclic_period([r], [t], [s], [(0,)], [(0,)], staleness=[k]) == pytest.approx(
        solo_period(r, t, s, k), rel=1e-6)


member = st.tuples(durations, durations, st.floats(0, 20), st.integers(0, 2),
                   st.integers(0, 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(member, min_size=1, max_size=4))
def test_no_schedule_violates_any_window(members: list[tuple[float, ...]]) -> None:
    r = [m[0] for m in members]
    t = [m[1] for m in members]
    s = [m[2] for m in members]
    k = [int(m[3]) for m in members]
    pins = [(int(m[4]),) for m in members]
    tpins = [(0,)] * len(members)
    runs = cyclic_timeline(r, t, s, pins, tpins, meta_iterations=12, staleness=k)
    train_end = {(p.member, p.meta_iteration): p.end_s for p in runs if p.phase == "train"}
    rollouts = {(p.member, p.meta_iteration): p for p in runs if p.phase == "rollout"}
    for p in runs:
        if p.phase == "rollout":
            # Uses weights no older than the window allows, never newer than exist.
            assert p.meta_iteration - k[p.member] <= p.weights_version <= p.meta_iteration
            if p.weights_version > 0:
                produced = train_end[(p.member, p.weights_version - 1)]
                assert p.start_s >= produced + s[p.member] - 1e-6
        else:
            # Training of step v consumes trajectories of versions in [v - 1 - k, v - 1].
            src = rollouts[(p.member, p.meta_iteration)]
            assert p.start_s >= src.end_s - 1e-6
            assert p.weights_version - 1 - k[p.member] <= src.weights_version
    for phase in ("rollout", "train"):
        by_node: dict[int, list[tuple[float, float]]] = {}
        for p in runs:
            if p.phase == phase:
                for node in p.nodes:
                    by_node.setdefault(node, []).append((p.start_s, p.end_s))
        for spans in by_node.values():
            spans.sort()
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert start >= end - 1e-6  # a node runs one phase at a time


def test_staleness_key_is_validated() -> None:
    base = ('name = "j"\n[model]\nparams_b = 1\n[rollout]\nprompts_per_step = 1\n'
            'samples_per_prompt = 1\nmax_response_tokens = 16\n[gpus]\nrollout = 1\ntrain = 1\n')
    assert parse_job("staleness = 1\n" + base).staleness == 1
    assert parse_job(base).staleness == 0
    with pytest.raises(ConfigError, match="fully asynchronous jobs"):
        parse_job('staleness = "unbounded"\n' + base, "j.toml")
    with pytest.raises(ConfigError, match="'staleness' = 50: must be <= 8"):
        parse_job("staleness = 50\n" + base, "j.toml")


def _place(*jobs: object) -> ClusterState:
    state = ClusterState(capacity())
    for job in jobs:
        d = WeavePolicy().place(state, job)  # type: ignore[arg-type]
        assert isinstance(d, Placement)
        state = apply(state, d)
    return state


def test_k1_job_packs_worse_when_its_own_overlap_is_the_point() -> None:
    """Balanced phases: alone, a k=1 job overlaps its rollout and training (period
    max(r, t)); in a group the shared training node takes that overlap away, so its
    slowdown against its own (faster) solo time is larger and it does not fit where
    the same job strictly on-policy does."""
    anchor = simple_profile("anchor", 100, 50, 2.0)
    k0 = simple_profile("k0", 100, 100, 1.3)
    k1 = simple_profile("k1", 100, 100, 1.3, staleness=1)
    assert k1.solo_s == 100 and k0.solo_s == 200
    assert len(_place(anchor, k0).groups) == 1  # period 200: 1.0x for k0, 1.33x for anchor
    assert len(_place(anchor, k1).groups) == 2  # period >= 200 is 2x k1's own 100 s


def test_k1_job_packs_better_when_its_window_shortens_the_group_cycle() -> None:
    """A rollout-heavy strict job forces the group period up to its own r + t, beyond a
    tight partner's budget; with k=1 its rollout runs on one-step-old weights while it
    trains, its own cycle shrinks to max(r, (r + t) / 2), and the partner fits."""
    anchor = simple_profile("anchor", 50, 100, 1.2)  # budget 180 s
    x0 = simple_profile("x0", 170, 30, 2.0)  # its own cycle: 200 s > 180 s
    x1 = simple_profile("x1", 170, 30, 2.0, staleness=1)  # its own cycle: 170 s
    assert len(_place(anchor, x0).groups) == 2
    together = _place(anchor, x1)
    assert len(together.groups) == 1
    assert together.groups[0].schedule.period_s == pytest.approx(170)
