"""The synthetic trace generator: statistics within tolerance, determinism, output."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.errors import ConfigError
from weave_slurm.sim.generate import (
    ROLLOUT_HEAVY_MIN_RATIO,
    TRAIN_HEAVY_MAX_RATIO,
    GeneratorConfig,
    TraceMix,
    generate_trace,
    kind_frequencies,
    mix_kind_weights,
    rollout_train_ratio,
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


def test_mixes_choose_kinds_by_rollout_over_training() -> None:
    profiles = load_profile_table()
    ratio = {k: rollout_train_ratio(profiles, k) for k in profiles.kinds}
    heavy = {k for k, r in ratio.items() if r >= ROLLOUT_HEAVY_MIN_RATIO}
    light = {k for k, r in ratio.items() if r <= TRAIN_HEAVY_MAX_RATIO}
    assert heavy == {"4B_4k", "4B_8k", "4B_16k", "8B_8k", "8B_16k"}
    assert light == {"7B_4k", "7B_8k", "14B_4k", "14B_8k", "32B_4k", "32B_8k"}
    assert mix_kind_weights(TraceMix.WILD, profiles) == wild_kind_weights()
    for mix, kinds in ((TraceMix.ROLLOUT_HEAVY, heavy), (TraceMix.TRAIN_HEAVY, light),
                       (TraceMix.MIXED, heavy | light)):
        trace = generate_trace(GeneratorConfig(n_jobs=400, seed=2, mix=mix,
                                               slo=SloDistribution.uniform(1.0, 1.2)))
        assert {j.kind for j in trace.jobs} == kinds
        assert all(1.0 <= (j.slo or 0) <= 1.2 for j in trace.jobs)
        assert f"mix={mix.value}" in trace.source
    mixed = generate_trace(GeneratorConfig(n_jobs=2000, seed=3, mix=TraceMix.MIXED))
    share = sum(j.kind in heavy for j in mixed.jobs) / len(mixed.jobs)
    assert share == pytest.approx(0.5, abs=0.04)   # half from each set
    light_trace = generate_trace(GeneratorConfig(n_jobs=400, seed=2, mix=TraceMix.TRAIN_HEAVY))
    synthetic = generate_trace(GeneratorConfig(n_jobs=400, seed=2,
                                               mix=TraceMix.SYNTHETIC_TRAIN_HEAVY))
    assert all(j.kind is None and j.t_rollout_colo_s is None for j in synthetic.jobs)
    assert all(0.125 <= (j.t_rollout_s or 0) / (j.t_train_s or 1) <= 0.5
               for j in synthetic.jobs)
    assert [(j.arrival_s, j.departure_s, j.slo) for j in synthetic.jobs] == [
        (j.arrival_s, j.departure_s, j.slo) for j in light_trace.jobs]
    with pytest.raises(ConfigError, match="kind_weights and mix 'mixed' both given"):
        GeneratorConfig(kind_weights=(("7B_8k", 1.0),), mix=TraceMix.MIXED)


def test_generate_cli_mix_and_slo_knobs(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.toml"
    argv = ["trace", "generate", str(out), "--jobs", "30", "--seed", "4",
            "--mix", "train-heavy", "--slo-dist", "uniform:1.5,2"]
    assert run_app(app, "weave", argv) == 0
    trace = load_trace(out)
    same = generate_trace(GeneratorConfig(n_jobs=30, seed=4, mix=TraceMix.TRAIN_HEAVY,
                                          slo=SloDistribution.uniform(1.5, 2.0)))
    assert [(j.job_id, j.kind, j.slo) for j in trace.jobs] == [
        (j.job_id, j.kind, j.slo) for j in same.jobs]
    assert all(1.5 <= (j.slo or 0) <= 2.0 for j in trace.jobs)
    capsys.readouterr()
    for flag, value, words in (
            ("--mix", "heavy", ("'--mix'", "'heavy'", "valid: wild, rollout-heavy, "
                                "train-heavy, mixed, synthetic-train-heavy")),
            ("--slo-dist", "tight", ("--slo-dist", "'tight'", "uniform:LOW,HIGH",
                                     "fixed:VALUE")),
            ("--slo-dist", "uniform:0.9,1.2", ("--slo-dist", "1 <= LOW <= HIGH"))):
        assert run_app(app, "weave", ["trace", "generate", str(tmp_path / "x.toml"),
                                      flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not (tmp_path / "x.toml").exists()
