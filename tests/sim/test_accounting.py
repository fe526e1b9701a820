"""Cost integration and the reference's accounting pieces, on hand-computed cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.model.cost import CostRates
from weave_slurm.sim.accounting import (
    Baseline,
    UsageSample,
    baseline_iterations,
    baseline_usage,
    group_cost_per_hour,
    integrate_cost,
    integrate_node_seconds,
    reference_baseline_cost,
    reference_group_rate,
    reference_unit_rates,
    reference_usd_rates,
    slo_met,
)
from weave_slurm.sim.loader import load_trace
from weave_slurm.vocab import Pool


def test_integrate_hand_computed() -> None:
    samples = [UsageSample(0.0, {Pool.ROLLOUT: 2, Pool.TRAIN: 1}),
               UsageSample(1800.0, {Pool.ROLLOUT: 4, Pool.TRAIN: 1}),
               UsageSample(5400.0, {Pool.ROLLOUT: 0, Pool.TRAIN: 0})]
    assert integrate_node_seconds(samples) == {Pool.ROLLOUT: 2 * 1800 + 4 * 3600,
                                               Pool.TRAIN: 5400.0}
    rates = CostRates(rollout_node_hour=10.0, train_node_hour=30.0)
    # h20: 2 nodes x 0.5 h + 4 x 1 h = 5 node-hours x 10; h800: 1.5 node-hours x 30
    assert integrate_cost(samples, rates) == pytest.approx(50.0 + 45.0)
    assert integrate_cost(samples[:2], rates, until_s=3600.0) == pytest.approx(
        (2 * 0.5 + 4 * 0.5) * 10 + 1.0 * 30)


def test_reference_rates() -> None:
    usd = reference_usd_rates()
    assert usd.price(Pool.TRAIN) == pytest.approx(42.24)
    assert usd.price(Pool.ROLLOUT) == pytest.approx(14.08)
    assert group_cost_per_hour(1, 3, reference_unit_rates()) == pytest.approx(2.0)
    assert reference_unit_rates() == CostRates(rollout_node_hour=1 / 3, train_node_hour=1.0)
    with pytest.raises(ConfigError, match="expected time order"):
        integrate_node_seconds([UsageSample(5.0, {}), UsageSample(1.0, {})])


def test_reference_group_rate_and_slo() -> None:
    assert reference_group_rate(3) == pytest.approx(2.0)
    assert reference_group_rate(3, slowdowns=[1.2, 1.6], slos=[1.5, 1.5]) == pytest.approx(3.2)
    assert slo_met(149.0, 100.0, 1.5)
    assert not slo_met(150.0, 100.0, 1.5)  # reference: >= is a violation
    assert not slo_met(100.0, 100.0, 1.0)


def test_baselines_on_hand_written_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_text("a, 2025-01-01 00:00:00, 1, 7B_8k\n"
                    "b, 2025-01-01 00:30:00, 1, 32B_8k\n"
                    "a, 2025-01-01 01:00:00, -1, 7B_8k\n"
                    "b, 2025-01-01 02:30:00, -1, 32B_8k\n")
    trace = load_trace(path)
    # a: 3600 s x 1 node pair; b (32B): 7200 s x 2 node pairs -> 18000 pair-seconds
    assert reference_baseline_cost(trace, Baseline.COLOCATED) == pytest.approx(18000.0)
    assert reference_baseline_cost(trace, Baseline.ISOLATED) == pytest.approx(24000.0)
    usage = baseline_usage(trace, Baseline.ISOLATED)
    assert [(u.nodes[Pool.ROLLOUT], u.nodes[Pool.TRAIN]) for u in usage] == [
        (1, 1), (3, 3), (2, 2), (0, 0)]
    a = trace.job("a")
    assert baseline_iterations(a, Baseline.ISOLATED) == 3600 // (133.8 + 112.8)
    assert baseline_iterations(a, Baseline.COLOCATED) == 3600 // (159.6 + 98.2)


def test_wild_baseline_golden_numbers() -> None:
    trace = load_trace("wild")
    isolated = reference_baseline_cost(trace, Baseline.ISOLATED)
    colocated = reference_baseline_cost(trace, Baseline.COLOCATED)
    assert isolated == pytest.approx(29_811_045.333, rel=1e-9)
    assert colocated == pytest.approx(22_358_284.0, rel=1e-9)
    # independent per-job formula of wild_trace_sim.baseline()
    per_job = sum((j.lifetime_s or 0) * (2 if (j.kind or "").startswith("32B") else 1)
                  for j in trace.jobs)
    assert colocated == pytest.approx(per_job)
    usd = integrate_cost(baseline_usage(trace, Baseline.ISOLATED), reference_usd_rates())
    assert usd == pytest.approx(isolated / 3600 * 42.24)
