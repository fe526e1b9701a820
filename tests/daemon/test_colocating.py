"""Co-location in weaved's placement (daemon/colocating.py, placing.py, membership.py):
which jobs it co-locates, what it stores for them and what it asks of Slurm."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import parse_site
from weave_slurm.daemon import allocplan, colocating, membership
from weave_slurm.daemon.placing import Placer
from weave_slurm.daemon.records import GroupRow
from weave_slurm.daemon.store import Store
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.model.profile import profile_job
from weave_slurm.placement import Capacity, WeavePolicy

MINIMAL = "[pools.rollout]\n[pools.train]\n"
SITE = parse_site(MINIMAL + "[limits]\ncolocation = true\n", "site.toml")
CAP = replace(Capacity.from_site(SITE), rollout_pool_nodes=2, train_pool_nodes=2)
TWO_RANKS = MemberLayout(TrainLayout((2,)), RolloutLayout(1, (1,)))


def _add(store: Store, name: str, colo_iter_s: float, *, layout: MemberLayout | None = None,
         cooperative: bool = False) -> int:
    """A pending reference job declaring its co-located iteration (12 s: cheaper than a
    group of its own; 1000 s: dearer)."""
    text = job_spec_toml(name, iterations=2, seed=1).replace(
        "[profile]\n", f"[profile]\ncolo_iter_s = {colo_iter_s}\n", 1)
    if cooperative:
        text += '\n[launch]\nscript = "python train.py"\n'
    spec = parse_job(text, f"{name}.toml")
    profile = profile_job(spec, SITE)
    if layout is not None:
        profile = replace(profile, layout=layout)
    return store.add_job(uid=1000, user="alice", name=name, spec=spec, spec_toml=text,
                         source=f"{name}.toml", profile=profile, now=1.0)


def _place(store: Store, cap: Capacity = CAP) -> None:
    Placer(store, cap, WeavePolicy(), SITE, "", lambda s: None).place(2.0)


def _group_of(store: Store, job_id: int) -> GroupRow:
    job = store.job(job_id)
    assert job is not None and job.group_id is not None, job
    group = store.group(job.group_id)
    assert group is not None
    return group


def test_a_colocated_job_gets_a_training_allocation_only_and_takes_no_newcomer(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    colo = _add(store, "colo", 12.0)
    _place(store)
    group = _group_of(store, colo)
    assert group.plan.colocated and group.plan.rollout_nodes == 0
    assert [m.rollout_pins for m in group.plan.members] == [()]
    needs = allocplan.needs(group.plan, [])
    assert [(w.role, w.nodes) for w in needs.wants] == [("train", 1)]
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 9)
    (model,) = state.groups
    assert model.colocated and state.closed == {group.group_id}
    apart = _add(store, "apart", 1000.0)   # it would join a disaggregated group like it
    _place(store)
    other = _group_of(store, apart)
    assert other.group_id != group.group_id and not other.plan.colocated
    assert other.plan.job_ids == (apart,) and other.plan.members[0].rollout_pins == (0,)
    assert _group_of(store, colo).plan == group.plan   # untouched


def test_without_colocation_the_same_job_gets_a_disaggregated_group(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _add(store, "colo", 12.0)
    _place(store, replace(CAP, colocation=False))
    plan = _group_of(store, job).plan
    assert not plan.colocated and plan.rollout_nodes == 1


def test_weaved_never_colocates_a_job_its_runtime_cannot_run_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    gang = _add(store, "gang", 12.0, layout=TWO_RANKS)
    coop = _add(store, "coop", 12.0, cooperative=True)
    rows = {j: store.job(j) for j in (gang, coop)}
    assert colocating.barrier(rows[gang], SITE) == (   # type: ignore[arg-type]
        "its layout is train 1x2 ranks; rollout 1x1 engine x 1 GPU; a co-located member runs "
        "one training rank and one engine")
    assert colocating.barrier(rows[coop], SITE) == (   # type: ignore[arg-type]
        "a cooperative job ([launch]: its own processes hold one node per role)")
    one_process = replace(SITE, runtime=replace(SITE.runtime, gangs=False))
    assert colocating.barrier(rows[gang], one_process) is None   # type: ignore[arg-type]
    for job in (gang, coop):
        row = rows[job]
        assert row is not None
        assert colocating.placeable(row, SITE, CAP).colo_iter_s == 0.0
        assert colocating.placeable(row, SITE, replace(CAP, colocation=False)
                                    ).colo_iter_s == 12.0
        _place(store)
        assert not _group_of(store, job).plan.colocated


def test_plans_of_running_jobs_are_made_without_colocation() -> None:
    assert CAP.colocation and not colocating.running(CAP).colocation
    off = replace(CAP, colocation=False)
    assert colocating.running(off) is off


def test_a_job_is_colocated_only_where_that_beats_any_group_of_jobs_like_it(
        tmp_path: Path) -> None:
    """A co-located group takes no newcomer, so a job co-located only because a group of
    one costs more would stay alone, dearer, for life. 20 s co-located (its solo
    iteration: 20.4 s) beats a group of its own but not a group of jobs like it: placed
    disaggregated, where the next ones can join it (12 s beats both: co-located, as
    the first test shows)."""
    store = Store(tmp_path / "w.db")
    first = _add(store, "first", 20.0)
    row = store.job(first)
    assert row is not None and colocating.placeable(row, SITE, CAP).colo_iter_s == 0.0
    assert colocating.placeable(row, SITE, replace(CAP, colocation=False)) == \
        row.profile.with_id(str(first))
    _place(store)   # alone: co-location would be its cheapest option now
    assert not _group_of(store, first).plan.colocated
