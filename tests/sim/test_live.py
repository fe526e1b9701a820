"""``weave-live`` replays weaved's co-location (sim/live.py, daemon/colocating.py): it
co-locates where placement finds it cheapest, never lets a newcomer join a co-located
group, re-plans running jobs without co-location (a member never switches between
co-located and disaggregated), and co-locates no job weaved's runtime could not run so."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import colocated_group
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.drift import DriftModel, DriftPattern
from weave_slurm.sim.generate import GeneratorConfig, TraceMix, generate_trace
from weave_slurm.sim.live import barrier, placeable, placing, planning
from weave_slurm.sim.outcome import ReplayResult
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.slo import SloDistribution
from weave_slurm.sim.traces import Trace, TraceJob

CAP = Capacity.from_site(reference_site(), 5, colocation=True)


def _trace(mix: TraceMix, slo: str, seed: int) -> Trace:
    return generate_trace(GeneratorConfig(n_jobs=30, seed=seed, mix=mix,
                                          slo=SloDistribution.parse(slo)))


def _replayed(tr: Trace, gang_gpus: int | None = None, colocation: bool = True
              ) -> dict[str, ReplayResult]:
    opts = ReplayOptions(accounting=Accounting.CONSISTENT, gang_gpus=gang_gpus)
    return replay_policies(tr, replace(CAP, colocation=colocation),
                           ("weave", "weave-live"), opts)


def _switched(res: ReplayResult) -> int:
    """Jobs that ran both co-located and disaggregated."""
    ways: dict[str, set[bool]] = defaultdict(set)
    for s in res.segments:
        for j in s.group.job_ids:
            ways[j].add(s.group.colocated)
    return sum(len(w) > 1 for w in ways.values())


def _joined(res: ReplayResult) -> int:
    """Co-located groups that took a newcomer (or became disaggregated) later."""
    seen: dict[int, set[tuple[bool, int]]] = defaultdict(set)
    for s in res.segments:
        seen[s.group.group_id].add((s.group.colocated, s.group.size))
    return sum(len(v) > 1 for v in seen.values() if (True, 1) in v)


def test_weave_live_colocates_where_colocation_beats_grouping() -> None:
    # training-heavy jobs with tight SLOs: no job shares a training node within its SLO,
    # so co-location beats every group (weave-live paid isolated's h20 nodes before)
    tr = _trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.0,1.2", 2)
    res = _replayed(tr)
    live = res["weave-live"]
    assert live.admissions["colocated"] == len(tr.jobs)
    off = _replayed(tr, colocation=False)["weave-live"]
    assert off.admissions["colocated"] == 0 and live.cost < off.cost / 1.2
    assert live.cost <= res["weave"].cost * (1 + 1e-9)
    assert not any(r.ever_violated for r in live.runs.values())


def test_weave_live_keeps_colocated_groups_closed_and_members_in_their_way() -> None:
    # a train-heavy trace with loose SLOs, where weave lets newcomers join co-located
    # jobs and re-plans co-located jobs again: weaved does neither
    tr = _trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.5,2", 2)
    res = _replayed(tr)
    weave, live = res["weave"], res["weave-live"]
    assert _joined(weave) > 0 and _switched(weave) > 0        # what weaved does not do
    assert live.admissions["colocated"] > 0
    assert any(not s.group.colocated and s.group.size > 1 for s in live.segments)
    assert _joined(live) == 0 and _switched(live) == 0
    assert not any(r.ever_violated for r in live.runs.values())


def test_weave_live_colocates_no_job_of_several_ranks_on_a_gangs_site() -> None:
    # weaved's default runtime starts one rank per training GPU: a trace job on whole
    # 8-GPU nodes has 8, so weaved co-locates none of them (weave may)
    res = _replayed(_trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.0,1.2", 2), gang_gpus=8)
    assert res["weave-live"].admissions["colocated"] == 0
    assert res["weave"].admissions["colocated"] > 0


def test_barrier_counts_ranks_of_whole_nodes() -> None:
    p = simple_profile("a", 100.0, 400.0, 1.5, colo_iter_s=450.0)
    assert barrier(p, None) is None and placeable(p, None, CAP) is p
    assert barrier(p, 1) is None                     # one GPU a node: one rank
    assert barrier(replace(p, colo_nodes=2), 1) == ("2 training ranks; a co-located member "
                                                    "runs one rank and one engine")
    assert barrier(p, 8) is not None
    assert placeable(p, 8, CAP).colo_iter_s == 0.0
    assert placeable(p, 8, CAP).solo_mean_s == p.solo_mean_s
    assert placeable(p, 8, replace(CAP, colocation=False)) is p


def test_a_job_is_colocated_only_where_that_beats_any_group_of_jobs_like_it() -> None:
    """weaved's co-located groups are closed: a job co-located because a group of one
    costs more would stay alone for life. Train-heavy (400 s of training a 500 s
    iteration): no two share a training node within the SLO, and co-located it is
    cheaper: it may be co-located. Rollout-heavy (100 s of training): five share one
    training node, cheaper than each co-located: it is placed disaggregated."""
    train_heavy = simple_profile("t", 100.0, 400.0, 1.5, colo_iter_s=450.0)
    rollout_heavy = simple_profile("r", 400.0, 100.0, 1.5, colo_iter_s=450.0)
    assert placeable(train_heavy, None, CAP) is train_heavy
    assert placeable(rollout_heavy, None, CAP).colo_iter_s == 0.0


def test_views_close_colocated_groups_and_plan_running_jobs_without_colocation() -> None:
    p = simple_profile("a", 100.0, 400.0, 1.5, colo_iter_s=450.0)
    state = ClusterState(CAP, (colocated_group(3, p),), 4)
    assert placing(state).closed == {3} and placing(state).capacity.colocation
    assert placing(state).open_groups() == ()
    plan = planning(state)
    assert plan.closed == {3} and not plan.capacity.colocation
    empty = ClusterState(CAP)
    assert placing(empty) is empty
    off = ClusterState(replace(CAP, colocation=False), state.groups)
    assert planning(off) is off


def test_weave_live_places_with_colocation_only_where_its_capacity_allows() -> None:
    # a capacity without co-location (the site's [limits] colocation unset, as weaved)
    tr = _trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.0,1.2", 3)
    res = _replayed(tr, colocation=False)
    assert res["weave-live"].admissions["colocated"] == 0
    assert SimPolicy.make("weave-live").colocating
    assert not SimPolicy.make("isolated").colocating


def test_weave_live_keeps_a_colocated_member_colocated_when_drift_breaks_its_slo() -> None:
    # co-located first (no pair of such jobs keeps a 1.05 SLO on one training node); its
    # rollout then grows 1.5x, its training 1.25x: co-located 1.1x its solo time, over
    # its SLO; weave re-places it disaggregated, weaved cannot switch a running member
    job = TraceJob("a", 0.0, 20_000.0, t_rollout_s=100.0, t_train_s=400.0, slo=1.05,
                   t_rollout_colo_s=120.0, t_train_colo_s=400.0)
    tr = Trace.from_jobs([job], start_time=None, source="test")
    opts = ReplayOptions(accounting=Accounting.CONSISTENT, gang_gpus=None,
                         drift=DriftModel(DriftPattern.INCREASING, steps=1))
    res = replay_policies(tr, CAP, ("weave", "weave-live"), opts)
    assert res["weave"].admissions["colocated"] == 1 and _switched(res["weave"]) == 1
    live = res["weave-live"]
    assert live.admissions["colocated"] == 1 and _switched(live) == 0
    assert all(s.group.colocated for s in live.segments) and live.runs["a"].ever_violated


def test_weave_live_replans_running_jobs_without_colocation() -> None:
    # on this trace re-plans made with co-location on would co-locate 4 running jobs
    # (measured by planning() left on); weaved's are made with it off
    tr = generate_trace(GeneratorConfig(n_jobs=40, seed=4, mix=TraceMix.TRAIN_HEAVY,
                                        slo=SloDistribution.parse("uniform:1.1,2")))
    live = _replayed(tr)["weave-live"]
    assert live.replans > 0 and live.admissions["colocated"] > 0
    assert _switched(live) == 0 and _joined(live) == 0
