"""Co-location as an admission option (placement/colocation.py, docs/placement.md
"Co-location"): a job whose rollout runs on its own training nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.colocation import (
    beats_grouping,
    cheaper_per_work,
    colocation_placement,
    grouped_floor,
    join_colocated,
    may_join_colocated,
)
from weave_slurm.placement.decision import Admission, Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.group import colocated_group
from weave_slurm.placement.moves import pauses, relabel
from weave_slurm.placement.optimum import optimum
from weave_slurm.placement.repack import best_group

from .conftest import capacity

COLO = replace(capacity(max_group_size=3), colocation=True)


def train_heavy(job_id: str, slo: float = 1.1):  # type: ignore[no-untyped-def]
    """Rollout a quarter of training, co-located at its disaggregated times: no group can
    share its training node within a tight SLO."""
    return simple_profile(job_id, 100.0, 400.0, slo, rollout_state_gib=200.0,
                          train_state_gib=300.0)


def placed(decision: object) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision


def test_off_unless_the_capacity_allows_it() -> None:
    job = train_heavy("a")
    assert colocation_placement(ClusterState(capacity()), job) is None
    d = placed(WeavePolicy().place(ClusterState(capacity()), job))
    assert d.admission is Admission.NEW_GROUP and not d.group.colocated


def test_a_job_that_can_share_nothing_is_colocated_not_isolated() -> None:
    # a new group holds an h20 node idle 80% of the time; co-located it pays one h800
    state = ClusterState(COLO)
    for i in range(3):
        d = placed(WeavePolicy().place(state, train_heavy(f"j{i}")))
        assert d.admission is Admission.COLOCATED
        assert d.group.colocated and d.group.rollout_nodes == 0 and d.group.train_nodes == 1
        assert d.cost_delta_per_hour == pytest.approx(1.0)   # one h800 node
        state = apply(state, d)
    assert state.cost_per_hour == pytest.approx(3.0)
    # its iteration: rollout + training on the same GPUs, at its SLO's expected solo
    assert state.groups[0].schedule.expected_period_s == pytest.approx(500.0)


def test_its_slo_host_and_gpu_memory_and_the_pool_bound_it() -> None:
    state = ClusterState(COLO)
    job = train_heavy("a")
    assert colocation_placement(state, job) is not None
    slow = replace(job, colo_iter_s=job.slo * job.solo_mean_s * 1.01)
    assert colocation_placement(state, slow) is None   # over its SLO co-located
    # both roles' warm state on the training node: 200 + 300 GiB
    assert colocation_placement(ClusterState(replace(COLO, train_mem_gib=499.0)), job) is None
    assert colocation_placement(ClusterState(replace(COLO, train_mem_gib=500.0)), job)
    peaky = replace(job, colo_gpu_peak_gib=81.0)
    assert colocation_placement(ClusterState(replace(COLO, train_gpu_mem_gib=80.0)),
                                peaky) is None
    assert colocation_placement(ClusterState(replace(COLO, train_pool_nodes=0)), job) is None
    assert colocation_placement(state, replace(job, solo=True)) is None   # runs as declared
    assert colocation_placement(state, replace(job, colo_iter_s=0.0)) is None


def test_slower_colocated_loses_to_a_new_group_per_unit_of_work() -> None:
    # co-located 1.4x slower (within its SLO of 1.5): one h800 at 1.4x the time costs
    # more per iteration than an h20 + h800 at 1x
    job = replace(train_heavy("a", slo=1.5), colo_iter_s=700.0)
    d = placed(WeavePolicy().place(ClusterState(COLO), job))
    assert d.admission is Admission.NEW_GROUP and not d.group.colocated


def test_a_newcomer_joins_a_colocated_job_which_goes_back_to_disaggregation() -> None:
    # two jobs whose rollouts fill each other's training: one h800 + one h20 for both
    a = simple_profile("a", 300.0, 300.0, 1.2)
    b = simple_profile("b", 300.0, 300.0, 1.2)
    state = apply(ClusterState(COLO), placed(WeavePolicy().place(ClusterState(COLO), a)))
    assert state.groups[0].colocated
    gid = state.groups[0].group_id
    d = placed(WeavePolicy().place(state, b))
    assert d.admission is Admission.SCALE_ROLLOUT and d.group_id == gid
    assert not d.group.colocated and d.group.job_ids == ("a", "b")
    assert d.group.rollout_nodes == 1 and d.cost_delta_per_hour == pytest.approx(1 / 3)
    after = relabel(state, apply(state, d))
    # the running job's rollout leaves its training node: a charged move of its state
    assert set(pauses(state, after, free=["b"])) == {"a"}


def test_a_job_whose_colocation_beats_any_grouping_stays_colocated() -> None:
    # one h800 for 500 s against 100 s of h20 + 400 s of h800 of work: 1.154 per unit of
    # work; two like it on one h800 + one h20 (period 800 s, within SLO 1.6): 1.231
    stays = placed(colocation_placement(ClusterState(COLO), train_heavy("a", slo=1.6)))
    assert grouped_floor(stays.group.members[0].job, COLO) == pytest.approx(
        4 / 3 * 800 / (2 * (100 / 3 + 400)))
    assert beats_grouping(stays, COLO)
    fits = simple_profile("c", 300.0, 30.0, 2.0)
    assert not may_join_colocated(stays.group, fits, COLO, 10)
    # balanced jobs: two on one h800 + one h20 leave no bubble (1.0), co-located 1.5
    balanced = simple_profile("b", 300.0, 300.0, 2.0)
    joins = placed(colocation_placement(ClusterState(COLO), balanced))
    assert grouped_floor(balanced, COLO) == pytest.approx(1.0)
    assert not beats_grouping(joins, COLO)


def test_joining_is_pruned_and_refused_as_a_group_would_be() -> None:
    g = colocated_group(1, simple_profile("a", 300.0, 300.0, 1.2))
    assert may_join_colocated(g, train_heavy("b"), COLO, 10) is False   # training: 2x
    assert may_join_colocated(g.disaggregated, train_heavy("b"), COLO, 10) is False
    fits = simple_profile("c", 300.0, 30.0, 2.0)
    assert may_join_colocated(g, fits, COLO, 10)
    assert join_colocated(g, fits, COLO, 0.0, 10) is None   # no rollout node free
    joined = join_colocated(g, fits, COLO, 5.0, 10)
    assert joined is not None and joined.group.size == 2


def test_work_of_a_colocated_job_is_priced_as_disaggregated() -> None:
    job = train_heavy("a")
    state = apply(ClusterState(COLO), placed(colocation_placement(ClusterState(COLO), job)))
    # one iteration is worth 100 s of an h20 node and 400 s of an h800 node
    value = 100.0 / 3 + 400.0
    assert state.work_per_hour == pytest.approx(value / 500.0)


def test_cheaper_per_work_takes_the_lower_ratio_first_on_ties() -> None:
    state = ClusterState(COLO)
    job = train_heavy("a")
    colo = placed(colocation_placement(state, job))
    fresh = placed(WeavePolicy().place(ClusterState(capacity()), job))
    assert cheaper_per_work(state, (fresh, colo)) is colo
    assert cheaper_per_work(state, (colo, colo)) is colo


def test_the_optimum_knows_colocation() -> None:
    jobs = [train_heavy(f"j{i}") for i in range(4)]
    assert optimum(jobs, capacity()).cost_per_hour == pytest.approx(4 * (1 + 1 / 3))
    best = optimum(jobs, COLO)
    assert best.cost_per_hour == pytest.approx(4.0)
    assert all(g.colocated for g in best.groups)
    g = best_group([jobs[0]], COLO, group_id=7)
    assert g is not None and g.colocated and g.group_id == 7
    # ... and the batch greedy finds it
    batch = place_batch(WeavePolicy(), ClusterState(COLO), jobs)
    assert batch.state.cost_per_hour == pytest.approx(4.0)


def test_mixed_cluster_disaggregated_and_colocated_groups_side_by_side() -> None:
    jobs = [train_heavy("t0"), train_heavy("t1"), simple_profile("r0", 300.0, 300.0, 1.3),
            simple_profile("r1", 300.0, 300.0, 1.3)]
    state = place_batch(WeavePolicy(), ClusterState(COLO), jobs).state
    kinds = {jid: g.colocated for g in state.groups for jid in g.job_ids}
    assert kinds == {"t0": True, "t1": True, "r0": False, "r1": False}
    assert state.cost_per_hour == pytest.approx(2.0 + 1.0 + 1 / 3)
