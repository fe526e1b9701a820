"""Failures, drift, re-planning policies and the `weave simulate` command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.model.cost import MoveCost
from weave_slurm.placement.capacity import Capacity
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.drift import DriftModel, DriftPattern
from weave_slurm.sim.failures import FailureModel
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.policies import Accounting
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report

SMALL = "philly_0_10000_20_parsed_all"
GPUS = {"rollout": 8, "train": 8}


def _cap(n: int = 3) -> Capacity:
    return Capacity.from_site(reference_site(), n)


def test_failures_roll_back_and_readmit_others_continue() -> None:
    trace = load_trace(SMALL)
    fm = FailureModel(0.01, checkpoint_every_iterations=5, restart_s=300.0, seed=1)
    clean_opts = ReplayOptions(accounting=Accounting.CONSISTENT)
    opts = ReplayOptions(accounting=Accounting.CONSISTENT, failures=fm)
    clean = replay_policies(trace, _cap(), ("weave", "isolated"), clean_opts)
    hit = replay_policies(trace, _cap(), ("weave", "isolated"), opts)
    for name in ("weave", "isolated"):
        assert hit[name].failures > 0
        assert all(r.departure_s is not None for r in hit[name].runs.values())
        # The same work is done in the end, lost iterations included.
        assert sum(r.done for r in hit[name].runs.values()) == pytest.approx(
            sum(r.done for r in clean[name].runs.values()), rel=1e-6)
    # Isolated jobs are re-admitted on fresh nodes of the same shape: a hit job departs
    # later by its lost iterations plus the restart, the others exactly on time.
    iso, iso_clean = hit["isolated"].runs, clean["isolated"].runs
    struck = [j for j, r in iso.items() if r.failures]
    assert struck and len(struck) < len(iso)
    for job_id, run in iso.items():
        base = iso_clean[job_id]
        assert run.departure_s is not None and base.departure_s is not None
        if run.failures:
            delay = run.lost_iterations * run.actual.solo_mean_s + run.failures * fm.restart_s
            assert run.departure_s == pytest.approx(base.departure_s + delay, rel=1e-6)
        else:
            assert run.departure_s == pytest.approx(base.departure_s)
    assert hit["isolated"].cost > clean["isolated"].cost


def test_drift_static_placement_misses_slos_that_replanning_keeps() -> None:
    trace = load_trace(SMALL)
    opts = ReplayOptions(drift=DriftModel(DriftPattern.INCREASING, amplitude=0.8))
    res = replay_policies(trace, _cap(), ("weave-online", "weave", "regroup"), opts)
    report = build_report(res, GPUS)["policies"]
    assert report["weave-online"]["slo_attainment"] < 1.0
    assert report["weave"]["slo_attainment"] > report["weave-online"]["slo_attainment"]
    # weave re-plans with the measured (drifted) phase times, as the daemon does.
    assert report["weave"]["life_slo_violations"] < report["weave-online"]["life_slo_violations"]
    assert report["regroup"]["regroups"] > 0


def test_optimal_is_a_lower_bound_of_the_greedy() -> None:
    trace = load_trace(SMALL)
    res = replay_policies(trace, _cap(), ("weave", "weave-online", "optimal"))
    assert res["optimal"].reference_units <= res["weave-online"].reference_units + 1e-6
    assert res["optimal"].optimum_fallbacks >= 0


def test_simulate_cli_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = run_app(app, "weave", ["simulate", SMALL, "--policy", "weave,isolated,colocated",
                                  "--max-group-size", "3", "--json", str(out),
                                  "--plot", str(tmp_path / "plots")])
    assert code == 0
    doc = json.loads(out.read_text())
    weave = doc["policies"]["weave"]
    for key in ("cost", "cost_per_hour", "slo_violations", "slo_attainment", "admissions",
                "peak_gpus", "bubble", "ratios", "slo_check"):
        assert key in weave
    assert set(weave["admissions"]) == {"direct", "scale_rollout", "new_group", "colocated"}
    assert weave["ratios"]["vs_isolated"] > 1
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "cost_rate.png", "gpus.png", "gantt.png"}


def test_corrupt_trace_line_names_the_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_text("a, 2025-01-01 00:00:00, 1, 100, 100, 1.5\n"
                   "b, 2025-01-01 00:10:00, 1, 100, oops, 1.5\n")
    code = run_app(app, "weave", ["simulate", str(bad)])
    assert code != 0
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "oops" in err


def test_unknown_policy_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(app, "weave", ["simulate", SMALL, "--policy", "weave,best"]) != 0
    err = capsys.readouterr().err
    assert "best" in err and "most-idle" in err


def test_trace_generate_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "gen.toml"
    assert run_app(app, "weave", ["trace", "generate", str(out), "--jobs", "20"]) == 0
    trace = load_trace(out)
    assert len(trace.jobs) == 20


def test_a_moved_job_keeps_the_progress_it_made_before_the_move() -> None:
    # Every re-plan moves jobs between groups; without a pause (no restart, a link so
    # fast the copy takes no time) each job's work must be exactly the sum over its
    # segments of time x turns / period.
    trace = load_trace(SMALL)
    opts = ReplayOptions(accounting=Accounting.CONSISTENT, migration_s=0.0)
    cap = replace(_cap(), moves=MoveCost(1e15, 1e15, restart_s=0.0, repin_restart_s=0.0))
    res = replay_policies(trace, cap, ("regroup",), opts)["regroup"]
    assert res.migrations > 0
    progress: dict[str, float] = {}
    for seg in res.segments:
        for m in seg.group.members:
            progress[m.job.job_id] = progress.get(m.job.job_id, 0.0) + (
                seg.end_s - seg.start_s) * m.turns / seg.group.schedule.expected_period_s
    for job_id, done in progress.items():
        assert done == pytest.approx(res.runs[job_id].work, rel=1e-9)
