"""Replays with co-location as weave's admission option (the default of ``weave
simulate``): co-located groups beside disaggregated ones, their cost, SLOs and bubbles
(``weave-live``, weaved's rules for it: tests/sim/test_live.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import colocated_group
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, TraceMix, generate_trace
from weave_slurm.sim.ledger import Ledger
from weave_slurm.sim.policies import Accounting
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report
from weave_slurm.sim.slo import SloDistribution

GPUS = {"rollout": 8, "train": 8}
OPTS = ReplayOptions(accounting=Accounting.CONSISTENT)
POLICIES = ("weave", "weave-live", "isolated", "colocated")


def trace(mix: TraceMix, slo: str, seed: int = 2):  # type: ignore[no-untyped-def]
    return generate_trace(GeneratorConfig(n_jobs=30, seed=seed, mix=mix,
                                          slo=SloDistribution.parse(slo)))


def replayed(tr, colocation: bool = True):  # type: ignore[no-untyped-def]
    cap = Capacity.from_site(reference_site(), 5, colocation=colocation)
    res = replay_policies(tr, cap, POLICIES, OPTS)
    return res, build_report(res, GPUS, ("weave", "weave-live"))["policies"]


def test_train_heavy_tight_slos_cost_no_more_than_colocation() -> None:
    # no job can share a training node within its SLO: before co-location weave paid
    # isolated's h20 nodes, idle ~78% of the time (1.333x co-located)
    res, rep = replayed(trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.0,1.2"))
    w = rep["weave"]
    assert w["cost"] <= min(rep["isolated"]["cost"], rep["colocated"]["cost"]) * (1 + 1e-9)
    assert w["admissions"]["colocated"] > 0
    assert w["slo_violations"] == 0 and w["life_slo_violations"] == 0
    assert w["slo_check"]["steady"]["worst_ratio"] <= 1.0 + 1e-6
    for run in res["weave"].runs.values():   # every job does all its work
        assert run.done == pytest.approx(run.work, rel=1e-6)
    before, _ = replayed(trace(TraceMix.SYNTHETIC_TRAIN_HEAVY, "uniform:1.0,1.2"), False)
    assert before["weave"].cost > w["cost"] * 1.2


def test_mixed_cluster_keeps_its_disaggregated_groups() -> None:
    res, rep = replayed(trace(TraceMix.MIXED, "uniform:1.5,2"))
    segs = res["weave"].segments
    assert any(s.group.colocated for s in segs) and any(
        not s.group.colocated and s.group.size > 1 for s in segs)
    w = rep["weave"]
    assert w["slo_violations"] == 0 and w["life_slo_violations"] == 0
    assert w["cost"] <= min(rep["isolated"]["cost"], rep["colocated"]["cost"])
    # a co-located group's training nodes are busy all the time, so the training pool's
    # bubble is that of the disaggregated groups' share only
    assert 0 <= w["bubble"]["train"] < 1 and 0 <= w["bubble"]["rollout"] < 1
    assert w["cost_over_bound"]["total"] >= 1 - 1e-9


def test_a_paused_colocated_job_takes_back_its_training_nodes_busy_time() -> None:
    job = simple_profile("a", 100.0, 400.0, 1.5)
    g = colocated_group(1, replace(job, colo_nodes=2))
    books = Ledger(0.0)
    books.pause(g, "a", 30.0)
    assert books.busy_s == {"rollout": 0.0, "train": pytest.approx(-60.0)}


def test_simulate_colocation_flags(tmp_path: Path) -> None:
    src = tmp_path / "t.toml"
    assert run_app(app, "weave", ["trace", "generate", str(src), "--jobs", "12", "--mix",
                                  "synthetic-train-heavy", "--slo-dist",
                                  "uniform:1.0,1.2"]) == 0
    runs = {}
    for flag in ([], ["--no-colocation"]):
        out = tmp_path / f"r{len(flag)}.json"
        assert run_app(app, "weave", ["simulate", str(src), "--policy", "weave,isolated",
                                      "--accounting", "consistent", "--no-verify",
                                      "--json", str(out), *flag]) == 0
        runs[len(flag)] = json.loads(out.read_text())["policies"]["weave"]
    assert runs[0]["admissions"]["colocated"] > 0        # on by default
    assert runs[1]["admissions"]["colocated"] == 0
    assert runs[0]["cost"] < runs[1]["cost"]
