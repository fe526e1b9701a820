from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.optimum import optimum
from weave_slurm.placement.repack import pinnings

from .conftest import capacity, job_lists


def test_pinnings_of_one_node_jobs_are_the_set_partitions() -> None:
    # Bell numbers: every way to split n one-node jobs over shared rollout nodes.
    assert [sum(1 for _ in pinnings([1] * n)) for n in range(6)] == [1, 1, 2, 5, 15, 52]


def test_pinnings_include_overlapping_multi_node_jobs() -> None:
    layouts = set(pinnings([2, 2]))
    assert ((0, 1), (1, 2)) in layouts  # share one node, one each of their own
    assert ((0, 1), (0, 1)) in layouts and ((0, 1), (2, 3)) in layouts
    for layout in layouts:  # nodes numbered in order of first use, no gaps
        used = sorted({p for pins in layout for p in pins})
        assert used == list(range(len(used)))


@settings(max_examples=40, deadline=None)
@given(jobs=job_lists(min_size=1, max_size=6))
def test_optimum_is_feasible_and_never_above_greedy(jobs: list[JobProfile]) -> None:
    cap = capacity(mem=1200)
    opt = optimum(jobs, cap)
    assert sorted(j for g in opt.groups for j in g.job_ids) == sorted(j.job_id for j in jobs)
    for g in opt.groups:
        assert g.feasible(cap.rollout_mem_gib, cap.train_mem_gib)
    greedy = place_batch(WeavePolicy(), ClusterState(cap), jobs).state
    assert opt.cost_per_hour <= greedy.cost_per_hour + 1e-9


def test_hand_checked_optimum() -> None:
    # Three complementary jobs fit one training node; a fourth tight job does not.
    cap = capacity()
    jobs = [simple_profile("a", 60, 100, 2.0), simple_profile("b", 60, 100, 2.0),
            simple_profile("c", 60, 100, 2.0), simple_profile("d", 300, 300, 1.0)]
    opt = optimum(jobs, cap)
    assert opt.cost_per_hour == pytest.approx(1 + 1 / 3 + 1 + 1 / 3)
    assert {g.job_ids for g in opt.groups} == {("a", "b", "c"), ("d",)}


def test_greedy_gap_on_random_sets_is_small() -> None:
    """The benchmark measures this at scale; here: a few sets must stay within 10%."""
    cap = capacity()
    ratios = []
    for seed in range(12):
        rng = random.Random(seed)
        jobs = [simple_profile(f"j{i}", rng.uniform(25, 600), rng.uniform(25, 600),
                               rng.uniform(1.1, 2)) for i in range(7)]
        greedy = place_batch(WeavePolicy(), ClusterState(cap), jobs).state.cost_per_hour
        ratios.append(greedy / optimum(jobs, cap).cost_per_hour)
    assert sum(ratios) / len(ratios) < 1.10
