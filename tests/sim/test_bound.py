"""The zero-bubble lower bound of a replay, and charged re-planning on whole traces."""

from __future__ import annotations

import pytest

from weave_slurm.data import reference_file
from weave_slurm.placement.capacity import Capacity
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.bound import IterationBusy, JobWork, ratios, work_bound
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.policies import Accounting, job_profile
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report
from weave_slurm.sim.traces import Trace

from .test_replay import GOLDEN

SMALL = "philly_0_10000_20_parsed_all"
GPUS = {"rollout": 8, "train": 8}
POLICIES = ("weave", "weave-online", "isolated", "colocated", "most-idle")


def _cap(n: int = 3) -> Capacity:
    return Capacity.from_site(reference_site(), n)


def _reference(name: str) -> str:
    """A packaged reference trace's name; the test is skipped when the data is absent."""
    if not (reference_file(f"{name}.trace").is_file()):
        pytest.skip(f"reference data {name}.trace is not installed")
    return name


def test_the_bound_prices_each_jobs_busy_phases_at_solo_speed() -> None:
    trace = load_trace(GOLDEN / "hand.trace")
    res = replay_policies(trace, _cap(), ("weave", "isolated"),
                          ReplayOptions(accounting=Accounting.CONSISTENT))
    bound = res["weave"].bound
    assert bound is not None and bound == res["isolated"].bound
    # a: 2 h of 100 + 100 s iterations; b: 2 h of 100 + 100; c: 1 h of 200 + 100.
    units = (7200 / 200 + 7200 / 200) * (100 / 3 + 100) + 3600 / 300 * (200 / 3 + 100)
    assert bound.reference_units == pytest.approx(units)
    rates = _cap().rates
    assert bound.total == pytest.approx(units * rates.train_node_hour / 3600)


def test_work_bound_and_ratios_by_hand() -> None:
    rates = _cap().rates
    busy = IterationBusy(rollout_node_s=3600.0, train_node_s=1800.0)
    bound = work_bound([JobWork("a", 2.0, busy), JobWork("b", float("inf"), busy)], rates)
    assert bound.pools["rollout"] == pytest.approx(2 * rates.rollout_node_hour)
    assert bound.pools["train"] == pytest.approx(rates.train_node_hour)
    assert bound.delivered({"a": 1.0, "b": 1.0}, rates) == pytest.approx(bound.total)
    pool_cost = {"rollout": 2 * bound.pools["rollout"], "train": bound.pools["train"]}
    out = ratios(sum(pool_cost.values()), pool_cost, bound, bound.total / 2)
    assert out["rollout"] == pytest.approx(2.0) and out["train"] == pytest.approx(1.0)
    assert out["delivered"] == pytest.approx(2 * (out["total"] or 0.0))
    assert ratios(1.0, None, bound, 0.0)["rollout"] is None


@pytest.mark.parametrize("accounting", list(Accounting))
def test_no_policy_beats_the_bound_and_pool_ratios_match_the_bubbles(
        accounting: Accounting) -> None:
    trace = load_trace(_reference(SMALL))
    res = replay_policies(trace, _cap(), POLICIES, ReplayOptions(accounting=accounting))
    report = build_report(res, GPUS)["policies"]
    for name, s in report.items():
        over = s["cost_over_bound"]
        assert over["delivered"] >= 1 - 1e-6, name  # the busy time of the work it did
        if accounting is Accounting.CONSISTENT:
            assert over["total"] >= 1 - 1e-6, name
            assert over["total"] == pytest.approx(over["delivered"], rel=1e-6)
        if name == "colocated":
            continue
        for pool in ("rollout", "train"):
            # Paid node-time over busy node-time, when the policy did the bound's work.
            if accounting is Accounting.CONSISTENT:
                assert over[pool] * (1 - s["bubble"][pool]) == pytest.approx(1, rel=1e-3)


def _trace(name: str) -> Trace:
    if name == "generated":
        _reference("wild")  # the generator draws kinds with wild.trace's frequencies
        return generate_trace(GeneratorConfig(n_jobs=60, arrival_window_s=4 * 86400.0,
                                              seed=5))
    return load_trace(_reference(SMALL))


@pytest.mark.parametrize("accounting", list(Accounting))
@pytest.mark.parametrize("trace_name", ["philly", "generated"])
def test_charged_re_planning_never_loses_to_arrival_placement(
        accounting: Accounting, trace_name: str) -> None:
    trace = _trace(trace_name)
    size = 3 if trace_name == "philly" else 5
    res = replay_policies(trace, _cap(size), ("weave", "weave-online"),
                          ReplayOptions(accounting=accounting))
    report = build_report(res, GPUS)["policies"]
    weave, online = report["weave"], report["weave-online"]
    assert weave["cost"] <= online["cost"] * (1 + 1e-9)
    assert weave["migrations"] > 0
    for s in (weave, online):
        assert s["slo_violations"] == 0 and s["life_slo_violations"] == 0
    if accounting is Accounting.CONSISTENT:
        assert weave["iterations"] == pytest.approx(online["iterations"])


def test_trace_jobs_carry_their_warm_state_for_moves() -> None:
    trace = load_trace(_reference("wild"))
    by_kind = {}
    for job in trace.jobs:
        p = job_profile(job, "weave", Accounting.CONSISTENT)
        by_kind[job.kind] = (p.rollout_state_gib, p.train_state_gib)
    assert by_kind["7B_8k"][0] == pytest.approx(275.7e9 / 2**30)
    assert by_kind["32B_8k"][1] == pytest.approx(520.4e9 / 2**30)
    assert by_kind["3B_8k"][0] < by_kind["7B_8k"][0] < by_kind["14B_8k"][0]
