"""GPU memory admission: per GPU, the members' switched-out residents plus one active
member's excess over its resident must fit the pool's GPU (docs/model.md "Device memory")."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.baselines import ColocatedPolicy
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.decision import Admission, Placement, Refusal
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.repack import best_group

from .conftest import capacity, job_lists

H20, H800 = 96.0, 80.0


def gpu_capacity(max_group_size: int = 3, mem: float = 1e9, pool: int = 10**6) -> Capacity:
    return dataclasses.replace(capacity(max_group_size, mem, pool), rollout_gpu_mem_gib=H20,
                               train_gpu_mem_gib=H800)


def job(job_id: str, *, r: float = 100, t: float = 100, slo: float = 2.0,
        rollout: tuple[float, float] = (0.0, 0.0), train: tuple[float, float] = (0.0, 0.0),
        train_nodes: int = 1, colo: float = 0.0) -> JobProfile:
    """A job with ``(peak, resident)`` per GPU for each role."""
    return dataclasses.replace(
        simple_profile(job_id, r, t, slo, train_nodes=train_nodes, rollout_state_gib=10,
                       train_state_gib=10),
        rollout_gpu_peak_gib=rollout[0], rollout_gpu_resident_gib=rollout[1],
        train_gpu_peak_gib=train[0], train_gpu_resident_gib=train[1], colo_gpu_peak_gib=colo)


def test_a_group_within_host_memory_but_not_gpu_memory_is_infeasible() -> None:
    cap = gpu_capacity(mem=100)   # host: 10 + 10 GiB per node fits
    a, b = job("a", train=(60, 30)), job("b", train=(60, 30))
    g = Group(1, (Member(a, (0,)), Member(b, (1,))), rollout_nodes=2, train_nodes=1)
    assert g.feasible(cap.rollout_mem_gib, cap.train_mem_gib)        # no device check
    assert not cap.fits(g)                                           # 30 + 30 + 30 > 80
    assert g.train_gpu_used_gib == (90.0,)
    small = Group(1, (Member(a, (0,)), Member(job("b", train=(31, 1)), (1,))), 2, 1)
    assert cap.fits(small) and small.train_gpu_used_gib == (61.0,)   # 30 + 1 + max(30, 30)


def test_rollout_nodes_count_only_the_members_pinned_there() -> None:
    cap = gpu_capacity()
    a, b, c = (job(x, rollout=(60, 40)) for x in "abc")
    # node 0: a and b (40 + 40 + 20 = 100 > 96); node 1: c alone
    shared = Group(1, (Member(a, (0,)), Member(b, (0,)), Member(c, (1,))), 2, 1)
    assert shared.rollout_gpu_used_gib == (100.0, 60.0)
    assert not cap.fits(shared)
    apart = Group(1, (Member(a, (0,)), Member(b, (1,)), Member(c, (2,))), 3, 1)
    assert cap.fits(apart) and apart.rollout_gpu_used_gib == (60.0, 60.0, 60.0)


def test_training_nodes_hold_the_members_training_there() -> None:
    a = job("a", train=(50, 10), train_nodes=2)
    b = job("b", train=(70, 5))
    g = Group(1, (Member(a, (0,)), Member(b, (0,))), rollout_nodes=1, train_nodes=2)
    # node 0: both (10 + 5 + max(40, 65)); node 1: a alone
    assert g.train_gpu_used_gib == (80.0, 50.0)
    assert g.train_gpu_parts == (15.0, 65.0)
    assert g.schedule.train_gpu_mem_gib == (80.0, 50.0)
    assert g.schedule.rollout_gpu_mem_gib == (0.0,)
    assert gpu_capacity().fits(g)
    assert not dataclasses.replace(gpu_capacity(), train_gpu_mem_gib=79.9).fits(g)


def test_admission_keeps_jobs_whose_gpus_would_overflow_apart() -> None:
    pol = WeavePolicy()
    for figures, kind in (((0.0, 0.0), Admission.DIRECT), ((60.0, 30.0), Admission.DIRECT),
                          ((60.0, 40.0), Admission.SCALE_ROLLOUT)):
        state = ClusterState(gpu_capacity())
        state = apply(state, pol.place(state, job("a", rollout=figures)))  # type: ignore[arg-type]
        d = pol.place(state, job("b", rollout=figures))
        assert isinstance(d, Placement) and d.admission is kind, (figures, d)
        assert gpu_capacity().fits(d.group)
    # training GPUs: every member of a group trains on node 0, so no group can take it
    state = ClusterState(gpu_capacity())
    state = apply(state, pol.place(state, job("a", train=(60, 30))))  # type: ignore[arg-type]
    d = pol.place(state, job("b", train=(60, 30)))
    assert isinstance(d, Placement) and d.admission is Admission.NEW_GROUP
    assert best_group([job("a", train=(60, 30)), job("b", train=(60, 30))],
                      gpu_capacity()) is None


def test_a_job_whose_peak_alone_overflows_a_gpu_is_refused_for_good() -> None:
    cap = gpu_capacity()
    for big, words in ((job("big", train=(80.5, 1)), "training peak 80.5 GiB per GPU exceeds "
                        "the training GPUs' memory (80 GiB)"),
                       (job("big", rollout=(97, 1)), "rollout peak 97.0 GiB per GPU exceeds "
                        "the rollout GPUs' memory (96 GiB)")):
        d = WeavePolicy().place(ClusterState(cap), big)
        assert isinstance(d, Refusal) and not d.retry and words in d.message(), d
    colo = job("colo", train=(70, 1), rollout=(90, 1), colo=81)
    d = ColocatedPolicy().place(ClusterState(cap), colo)
    assert isinstance(d, Refusal) and "training peak 81.0 GiB per GPU (co-located)" in d.message()
    assert isinstance(WeavePolicy().place(ClusterState(cap), colo), Placement)


def test_departure_compaction_respects_gpu_memory() -> None:
    cap = gpu_capacity()
    a, b, c = job("a", rollout=(60, 40)), job("b", rollout=(60, 40)), job("c")
    # c shares a's node, b has its own; once c leaves, b must not move onto a's node
    g = Group(1, (Member(a, (0,)), Member(c, (0,)), Member(b, (1,))), 2, 1)
    state = ClusterState(cap, (g,), 2)
    assert depart(state, "c").groups[0].rollout_nodes == 2
    free = dataclasses.replace(cap, rollout_gpu_mem_gib=math.inf)
    assert depart(ClusterState(free, (g,), 2), "c").groups[0].rollout_nodes == 1


@settings(max_examples=60, deadline=None)
@given(jobs=job_lists(max_size=10))
def test_zero_figures_leave_every_placement_unchanged(jobs: list[JobProfile]) -> None:
    """A trace's jobs (no device figures) place the same with GPU limits as without."""
    plain = place_batch(WeavePolicy(), ClusterState(capacity(mem=1200)), jobs)
    checked = place_batch(WeavePolicy(), ClusterState(gpu_capacity(mem=1200)), jobs)
    assert [g.members for g in plain.state.groups] == [g.members for g in checked.state.groups]
    assert [type(d) for d in plain.decisions] == [type(d) for d in checked.decisions]


def _device_ok(g: Group, cap: Capacity) -> bool:
    """The rule, computed again from the members (not from the group's cache)."""
    for node in range(g.rollout_nodes):
        on = [m.job for m in g.members if node in m.rollout_pins]
        use = sum(j.rollout_gpu_resident_gib for j in on) + max(
            [j.rollout_gpu_peak_gib - j.rollout_gpu_resident_gib for j in on] + [0.0])
        if use > cap.rollout_gpu_mem_gib + 1e-9:
            return False
    for node in range(g.train_nodes):
        on = [m.job for m in g.members if node < m.job.train_nodes]
        use = sum(j.train_gpu_resident_gib for j in on) + max(
            [j.train_gpu_peak_gib - j.train_gpu_resident_gib for j in on] + [0.0])
        if use > cap.train_gpu_mem_gib + 1e-9:
            return False
    return True


@settings(max_examples=80, deadline=None)
@given(jobs=job_lists(max_size=9), data=st.data())
def test_every_placed_group_fits_its_gpus(jobs: list[JobProfile], data: st.DataObject) -> None:
    figures = st.tuples(st.floats(1, 90), st.floats(0, 40)).map(lambda pr: (pr[0], min(*pr)))
    jobs = [dataclasses.replace(j, rollout_gpu_peak_gib=rp, rollout_gpu_resident_gib=rr,
                                train_gpu_peak_gib=min(tp, 79), train_gpu_resident_gib=tr)
            for j in jobs for (rp, rr), (tp, tr) in [(data.draw(figures), data.draw(figures))]]
    cap = gpu_capacity(max_group_size=4)
    result = place_batch(WeavePolicy(), ClusterState(cap), jobs)
    assert all(isinstance(d, Placement) for d in result.decisions)
    for g in result.state.groups:
        assert _device_ok(g, cap), g
        assert cap.fits(g)
