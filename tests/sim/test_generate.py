"""The synthetic trace generator: statistics within tolerance, determinism, output."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.sim.generate import (
    GeneratorConfig,
    generate_trace,
    kind_frequencies,
    wild_kind_weights,
)
from weave_slurm.sim.loader import load_trace, save_trace
from weave_slurm.sim.profiles import load_profile_table
from weave_slurm.sim.slo import SloDistribution


def test_default_mix_matches_paper_statistics() -> None:
    trace = generate_trace()
    assert len(trace.jobs) == 200
    lifetimes = [j.lifetime_s or 0 for j in trace.jobs]
    assert sum(lifetimes) / len(lifetimes) / 3600 == pytest.approx(27.9, rel=0.15)
    assert max(j.arrival_s for j in trace.jobs) <= 14 * 86400
    assert all(1.0 <= (j.slo or 0) <= 2.0 for j in trace.jobs)
    kinds = load_profile_table().kinds
    assert all(j.kind in kinds and j.t_rollout_s and j.t_train_colo_s for j in trace.jobs)
    assert 10 <= trace.max_concurrent() <= 60


def test_large_trace_statistics_close_to_targets() -> None:
    trace = generate_trace(GeneratorConfig(n_jobs=10_000, seed=11))
    assert len(trace.jobs) == 10_000
    assert trace.mean_lifetime_s() / 3600 == pytest.approx(27.9, rel=0.04)
    slos = [j.slo or 0 for j in trace.jobs]
    assert sum(slos) / len(slos) == pytest.approx(1.5, abs=0.02)
    wild = dict(wild_kind_weights())
    total = sum(wild.values())
    freq = kind_frequencies(trace)
    for kind, count in wild.items():
        assert freq.get(kind, 0.0) == pytest.approx(count / total, abs=0.02)
    # arrivals spread evenly: each half of the window gets about half the jobs
    first_half = sum(1 for j in trace.jobs if j.arrival_s < 7 * 86400)
    assert first_half == pytest.approx(5000, abs=300)


def test_seed_determinism_and_configuration(tmp_path: Path) -> None:
    a = generate_trace(GeneratorConfig(n_jobs=50, seed=3))
    assert a.jobs == generate_trace(GeneratorConfig(n_jobs=50, seed=3)).jobs
    assert a.jobs != generate_trace(GeneratorConfig(n_jobs=50, seed=4)).jobs
    only = generate_trace(GeneratorConfig(n_jobs=30, kind_weights=(("32B_4k", 1.0),),
                                          slo=SloDistribution.fixed(1.3)))
    assert {j.kind for j in only.jobs} == {"32B_4k"} and {j.slo for j in only.jobs} == {1.3}
    with pytest.raises(ConfigError, match="kind '99B_1k' has no profile"):
        generate_trace(GeneratorConfig(kind_weights=(("99B_1k", 1.0),)))
    with pytest.raises(ConfigError, match="--jobs 0"):
        GeneratorConfig(n_jobs=0)


def test_generated_trace_written_and_read_back(tmp_path: Path) -> None:
    trace = generate_trace(GeneratorConfig(n_jobs=40, seed=5))
    save_trace(trace, tmp_path / "g.toml")
    save_trace(trace, tmp_path / "g.trace", "wild")
    toml = load_trace(tmp_path / "g.toml")
    wild = load_trace(tmp_path / "g.trace")
    assert [(j.job_id, j.kind, j.slo) for j in toml.jobs] == [
        (j.job_id, j.kind, j.slo) for j in trace.jobs]
    assert [j.departure_s for j in toml.jobs] == pytest.approx(
        [j.departure_s for j in trace.jobs])
    assert [j.kind for j in wild.jobs] == [j.kind for j in trace.jobs]
    assert [j.lifetime_s for j in wild.jobs] == pytest.approx(
        [j.lifetime_s for j in trace.jobs], abs=1.0)
