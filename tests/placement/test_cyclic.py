from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.placement.cyclic import cyclic_period

durations = st.floats(min_value=1, max_value=600)


def test_single_job_period_is_its_iteration() -> None:
    assert cyclic_period([30], [20], [5], [(0,)], [(0,)]) == pytest.approx(55)


def test_two_jobs_sharing_only_training() -> None:
    # Training is the bottleneck: 40 + 40 per meta-iteration.
    assert cyclic_period([10, 10], [40, 40], [0, 0], [(0,), (1,)], [(0,), (0,)]) == 80
    # Rollout is long: each job's own cycle dominates.
    assert cyclic_period([100, 10], [20, 20], [0, 0], [(0,), (1,)], [(0,), (0,)]) == 120


def test_shared_rollout_node_hand_computed() -> None:
    # A and B share one rollout node and the training node, r=(30, 10), t=(10, 30):
    # the two rollouts (40 s) and the two trainings (40 s) pipeline perfectly, and
    # no single job's cycle (40 s each) is longer.
    assert cyclic_period([30, 10], [10, 30], [0, 0], [(0,), (0,)],
                         [(0,), (0,)]) == pytest.approx(40)
    # With r=(30, 30), t=(10, 10) the shared rollout node is the bottleneck: 60 s.
    assert cyclic_period([30, 30], [10, 10], [0, 0], [(0,), (0,)],
                         [(0,), (0,)]) == pytest.approx(60)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(durations, durations, st.floats(0, 30)), min_size=1, max_size=5))
def test_closed_form_matches_the_recurrence(jobs: list[tuple[float, float, float]]) -> None:
    r, t, s = (list(x) for x in zip(*jobs, strict=True))
    n = len(jobs)
    pins = [(i,) for i in range(n)]
    tpins = [(0,)] * n
    fast = cyclic_period(r, t, s, pins, tpins)
    slow = cyclic_period(r, t, s, pins, tpins, closed_form=False)
    assert fast == pytest.approx(slow, rel=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(durations, durations, st.integers(0, 2)), min_size=1, max_size=5))
def test_period_bounded_by_loads_and_the_serial_schedule(
        jobs: list[tuple[float, float, int]]) -> None:
    r = [j[0] for j in jobs]
    t = [j[1] for j in jobs]
    pins = [(j[2],) for j in jobs]
    p = cyclic_period(r, t, [0.0] * len(jobs), pins, [(0,)] * len(jobs))
    loads = [sum(ri for ri, pi in zip(r, pins, strict=True) if pi == (n,)) for n in range(3)]
    lower = max(sum(t), *loads, *(a + b for a, b in zip(r, t, strict=True)))
    assert p >= lower - 1e-6
    assert p <= sum(r) + sum(t) + 1e-6  # never worse than running everything in series


def test_round_robin_is_never_beaten_by_any_pair_of_orders() -> None:
    """Exhaustive check of the paper's claim on small random groups (see docs/placement.md).

    For every group we compare the best cyclic round-robin order (the same order on
    rollout and training nodes) with the best of ALL (rollout order, training order)
    pairs; the round-robin must match it.
    """
    rng = random.Random(7)
    for _ in range(80):
        n = rng.randint(2, 4)
        nodes = rng.randint(1, n)
        r = [rng.uniform(10, 100) for _ in range(n)]
        t = [rng.uniform(10, 100) for _ in range(n)]
        s = [rng.uniform(0, 10) for _ in range(n)]
        pins = [(rng.randrange(nodes),) for _ in range(n)]
        tpins = [(0,)] * n
        rr = min(cyclic_period(r, t, s, pins, tpins, (0, *p), (0, *p))
                 for p in itertools.permutations(range(1, n)))
        best = min(cyclic_period(r, t, s, pins, tpins, a, b)
                   for a in itertools.permutations(range(n))
                   for b in itertools.permutations(range(n)))
        assert rr <= best + 1e-6
