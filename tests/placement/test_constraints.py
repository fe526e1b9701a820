"""placement/constraints.py: jobs of different Slurm accounts (or QOS) never share a group;
jobs of the same charge do, exactly as jobs without one."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.model.charge import Charge
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.consolidate import regrouped
from weave_slurm.placement.decision import Admission, Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.optimum import optimum
from weave_slurm.placement.repack import best_group

from .conftest import capacity, job_lists

PHYSICS, BIO = Charge("physics"), Charge("bio")


def _pair(a_charge: Charge, b_charge: Charge) -> tuple[JobProfile, JobProfile]:
    # complementary jobs: alone they pack directly (test_engine: direct packing)
    a = replace(simple_profile("a", rollout_s=300, train_s=60, slo=1.3), charge=a_charge)
    b = replace(simple_profile("b", rollout_s=60, train_s=250, slo=1.3), charge=b_charge)
    return a, b


def _second(a: JobProfile, b: JobProfile) -> Placement:
    state, pol = ClusterState(capacity()), WeavePolicy()
    state = apply(state, pol.place(state, a))  # type: ignore[arg-type]
    d = pol.place(state, b)
    assert isinstance(d, Placement)
    return d


def test_jobs_of_the_same_account_share_a_group() -> None:
    d = _second(*_pair(PHYSICS, Charge("physics")))   # equal, not the same object
    assert d.admission is Admission.DIRECT and set(d.group.job_ids) == {"a", "b"}


def test_jobs_of_different_accounts_never_share_a_group() -> None:
    d = _second(*_pair(PHYSICS, BIO))
    assert d.admission is Admission.NEW_GROUP and d.group.job_ids == ("b",)
    d = _second(*_pair(PHYSICS, Charge()))   # an account vs Slurm's default
    assert d.admission is Admission.NEW_GROUP
    d = _second(*_pair(Charge("physics", "high"), Charge("physics", "low")))   # QOS too
    assert d.admission is Admission.NEW_GROUP


def test_best_group_and_the_optimum_never_mix_charges() -> None:
    a, b = _pair(PHYSICS, BIO)
    assert best_group([a, b], capacity()) is None
    assert best_group([a, replace(b, charge=PHYSICS)], capacity()) is not None
    opt = optimum([a, b], capacity())
    assert opt.groups and all(len(g.members) == 1 for g in opt.groups)


@settings(max_examples=40, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=10), accounts=st.lists(
    st.sampled_from(["physics", "bio", None]), min_size=10, max_size=10))
def test_no_group_of_any_batch_or_regroup_mixes_accounts(
        jobs: list[JobProfile], accounts: list[str | None]) -> None:
    charged = [replace(j, charge=Charge(acc)) for j, acc in zip(jobs, accounts, strict=False)]
    cap, pol = capacity(max_group_size=5), WeavePolicy()
    for state in (place_batch(pol, ClusterState(cap), charged).state,
                  regrouped(pol, ClusterState(cap), charged)):
        for group in state.groups:
            assert len({m.job.charge for m in group.members}) == 1, group.job_ids


@settings(max_examples=25, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=10))
def test_one_account_for_all_places_exactly_as_no_account(jobs: list[JobProfile]) -> None:
    cap, pol = capacity(max_group_size=5), WeavePolicy()
    plain = place_batch(pol, ClusterState(cap), jobs).state
    same = place_batch(pol, ClusterState(cap),
                       [replace(j, charge=PHYSICS) for j in jobs]).state
    assert [g.job_ids for g in plain.groups] == [g.job_ids for g in same.groups]


# -- solo (weave-sbatch --solo): a solo job is a group of its own -------------------------

def test_a_solo_job_joins_no_group_and_no_job_joins_it() -> None:
    a, b = _pair(Charge(), Charge())
    d = _second(replace(a, solo=True), b)   # the solo job came first: b joins no one
    assert d.admission is Admission.NEW_GROUP and d.group.job_ids == ("b",)
    d = _second(a, replace(b, solo=True))   # it comes second: it joins no one
    assert d.admission is Admission.NEW_GROUP and d.group.job_ids == ("b",)


def test_best_group_and_the_optimum_never_group_a_solo_job() -> None:
    a, b = _pair(Charge(), Charge())
    assert best_group([a, b], capacity()) is not None
    assert best_group([a, replace(b, solo=True)], capacity()) is None
    assert best_group([replace(a, solo=True)], capacity()) is not None   # alone: yes
    opt = optimum([replace(a, solo=True), b], capacity())
    assert opt.groups and all(len(g.members) == 1 for g in opt.groups)


@settings(max_examples=40, deadline=None)
@given(jobs=job_lists(min_size=2, max_size=10), solo=st.lists(st.booleans(), min_size=10,
                                                               max_size=10),
       pooled=st.booleans())
def test_no_placement_batch_or_regroup_groups_a_solo_job(
        jobs: list[JobProfile], solo: list[bool], pooled: bool) -> None:
    marked = [replace(j, solo=s) for j, s in zip(jobs, solo, strict=False)]
    cap, pol = replace(capacity(max_group_size=5), rollout_pooled=pooled), WeavePolicy()
    online = ClusterState(cap)
    for job in marked:
        decision = pol.place(online, job)
        if isinstance(decision, Placement):
            online = apply(online, decision)
    for state in (online, place_batch(pol, ClusterState(cap), marked).state,
                  regrouped(pol, ClusterState(cap), marked)):
        for group in state.groups:
            assert len(group.members) == 1 or not any(m.job.solo for m in group.members), \
                group.job_ids
