"""Pooled placement's branch and bound (placement/pooled_placement.py): the bounds it
prunes with never cut off the placement an exhaustive search picks."""

from __future__ import annotations

import math
import random

import pytest

import weave_slurm.placement.pooled_placement as pp
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.pooled_placement import _joined, _ratio_bound
from weave_slurm.placement.work import group_work_rate

from .test_pooled import pooled_cap


def _cluster(seed: int, jobs: int) -> tuple[ClusterState, random.Random]:
    rng = random.Random(seed)
    policy, state = WeavePolicy(), ClusterState(pooled_cap(max_group_size=3))
    for i in range(jobs):
        job = simple_profile(f"j{i}", rng.uniform(25, 600), rng.uniform(25, 600),
                             rng.uniform(1.1, 2))
        decision = policy.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
    return state, rng


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_on_the_fewest_feasible_width_never_exceeds_the_joined_ratio(
        seed: int) -> None:
    """What ``_joined`` skips the width search with is a lower bound on the cluster's
    cost per unit of work once the newcomer joins: checked against the exact ratio of
    every group a drawn arrival may join."""
    state, rng = _cluster(seed, 40)
    cap = state.capacity
    cost, work = state.cost_per_hour, state.work_per_hour
    checked = 0
    for k in range(8):
        job = simple_profile(f"n{k}", rng.uniform(25, 600), rng.uniform(25, 600),
                             rng.uniform(1.1, 2))
        for g in state.open_groups():
            narrow: list[tuple[int, tuple[object, ...]]] = []

            def never(gpus: int, members: tuple[object, ...],
                      seen: list[tuple[int, tuple[object, ...]]] = narrow) -> bool:
                seen.append((gpus, members))
                return False

            joined = _joined(g, job, cap, True, 10**6, never)
            if joined is None:
                continue
            (gpus, members), = narrow
            exact = (cost + joined.cost_delta_per_hour) / (
                work + group_work_rate(joined.group, cap) - group_work_rate(g, cap))
            bound = _ratio_bound(g, members, gpus, cap, cost, work)  # type: ignore[arg-type]
            assert bound <= exact + 1e-9, (g.group_id, job.job_id, bound, exact)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("seed", range(4))
def test_pruned_placement_is_the_exhaustive_one(seed: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every arrival goes where trying every group, with no early stop and the width
    search never skipped, sends it."""
    state, rng = _cluster(100 + seed, 60)
    policy = WeavePolicy()
    original = pp._joined
    for k in range(10):
        job = simple_profile(f"n{k}", rng.uniform(25, 600), rng.uniform(25, 600),
                             rng.uniform(1.1, 2))
        pruned = policy.place(state, job)
        with monkeypatch.context() as mp:
            mp.setattr(pp, "_joined", lambda g, j, c, t, f, beaten: original(
                g, j, c, t, f, lambda *_: False))
            mp.setattr(pp, "_bound", lambda *a, **kw: -math.inf)
            full = policy.place(state, job)
        assert repr(pruned) == repr(full), job.job_id
