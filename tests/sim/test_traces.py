"""Trace readers on the packaged reference files and on small hand-written traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.sim.loader import load_trace, read_trace_file, resolve_trace_path, save_trace
from weave_slurm.sim.slo import SloDistribution
from weave_slurm.sim.traces import EventKind, TraceFormat


def test_wild_matches_published_statistics() -> None:
    trace = load_trace("wild")
    assert len(trace.jobs) == 200
    assert trace.max_concurrent() == 38
    assert trace.mean_lifetime_s() / 3600 == pytest.approx(27.95, abs=0.005)
    assert trace.mean_concurrent() == pytest.approx(15.1, abs=0.05)
    assert trace.end_s / 86400 == pytest.approx(15.42, abs=0.01)
    assert all(job.departure_s is not None for job in trace.jobs)


def test_wild_profiles_come_from_profile_json_by_kind() -> None:
    job0 = load_trace("wild").job("job0")
    assert job0.kind == "14B_8k"
    assert (job0.t_rollout_s, job0.t_train_s) == (238.6, 197.4)  # disagg
    assert (job0.t_rollout_colo_s, job0.t_train_colo_s) == (182.4, 173.6)  # colo
    assert job0.lifetime_s == 51628.0


def test_wild_slos_reproduce_reference_draws() -> None:
    import random

    rng = random.Random(2345)  # the reference: random.seed(2345); uniform(1.1, 2) per arrival
    expected = [rng.uniform(1.1, 2) for _ in range(200)]
    trace = load_trace("wild")
    assert [job.slo for job in trace.jobs] == expected


def test_slo_draws_are_deterministic_and_seeded() -> None:
    a = load_trace("wild", slo="uniform:1,3", seed=7)
    b = load_trace("wild", slo="uniform:1,3", seed=7)
    c = load_trace("wild", slo="uniform:1,3", seed=8)
    assert [j.slo for j in a.jobs] == [j.slo for j in b.jobs]
    assert [j.slo for j in a.jobs] != [j.slo for j in c.jobs]
    assert all(1 <= (j.slo or 0) <= 3 for j in a.jobs)
    fixed = load_trace("wild", slo=SloDistribution.fixed(1.5))
    assert {j.slo for j in fixed.jobs} == {1.5}


def test_philly_plain_gets_synthetic_profiles_deterministically() -> None:
    a = load_trace("philly_0_10000_20", seed=3)
    b = load_trace("philly_0_10000_20", seed=3)
    assert len(a.jobs) == 77
    assert a.jobs == b.jobs
    for job in a.jobs:
        assert job.t_rollout_s is not None and 25 <= job.t_rollout_s <= 600
        assert job.t_train_s is not None and 25 <= job.t_train_s <= 600
    assert load_trace("philly_0_30000_20").max_concurrent() > 0
    assert len(load_trace("philly_0_30000_20").jobs) == 294


def test_philly_parsed_keeps_profiles_and_slos_from_file() -> None:
    trace = load_trace("philly_0_10000_20_parsed_all")
    assert len(trace.jobs) == 77
    first = trace.jobs[0]
    assert first.job_id == "1504131676014_24247"
    assert first.t_rollout_s == pytest.approx(41.150814057555145)
    assert first.t_train_s == pytest.approx(193.3934518078255)
    assert first.slo == pytest.approx(1.6776372062205824)
    plain = load_trace("philly_0_10000_20")
    assert [j.lifetime_s for j in plain.jobs] == [j.lifetime_s for j in trace.jobs]


def test_format_detection_and_forcing(tmp_path: Path) -> None:
    for name, fmt in [("wild", TraceFormat.WILD), ("philly_0_10000_20", TraceFormat.PHILLY),
                      ("philly_0_10000_20_parsed_all", TraceFormat.PHILLY_PARSED)]:
        path = resolve_trace_path(name)
        assert len(read_trace_file(path).jobs) == len(read_trace_file(path, fmt).jobs)
    with pytest.raises(ConfigError, match=r"philly_0_10000_20_parsed_all.trace:1: .*philly-parsed"):
        read_trace_file(resolve_trace_path("philly_0_10000_20_parsed_all"), TraceFormat.PHILLY)
    with pytest.raises(ConfigError, match="valid: wild, philly, philly-parsed, toml"):
        TraceFormat.parse("csv")


def test_unknown_trace_name_lists_packaged_ones() -> None:
    with pytest.raises(ConfigError, match="wild"):
        resolve_trace_path("no_such_trace")


def test_small_hand_written_wild_trace(tmp_path: Path) -> None:
    path = tmp_path / "tiny.trace"
    path.write_text("# tiny\n"
                    "a, 2025-01-01 00:00:00, 1, 7B_8k\n"
                    "b, 2025-01-01 00:00:10, 1, 32B_8k\n"
                    "\n"
                    "a, 2025-01-01 01:00:00, -1, 7B_8k\n"
                    "c, 2025-01-01 01:00:00, 1, 3B_4k\n")
    trace = load_trace(path)
    assert [j.job_id for j in trace.jobs] == ["a", "b", "c"]
    assert trace.job("a").lifetime_s == 3600.0
    assert trace.job("b").departure_s is None
    assert trace.job("c").arrival_s == 3600.0
    assert [e.kind for e in trace.events] == [EventKind.ARRIVAL, EventKind.ARRIVAL,
                                              EventKind.DEPARTURE, EventKind.ARRIVAL]
    assert trace.max_concurrent() == 2
    assert trace.job("a").source_line == 2


def test_toml_trace_round_trip_and_features(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    path = tmp_path / "mix.toml"
    path.write_text('version = 1\nsource = "mix"\n\n'
                    '[[job]]\nid = "x"\narrival_s = 10.0\nlifetime_s = 100.0\nkind = "7B_8k"\n\n'
                    '[[job]]  # inline profile\nid = "y"\narrival_s = 0\niterations = 5\n'
                    't_rollout_s = 10.0\nt_train_s = 5.0\nslo = 1.25\nspec = "jobs/y.toml"\n')
    trace = load_trace(path)
    assert [j.job_id for j in trace.jobs] == ["y", "x"]
    x, y = trace.job("x"), trace.job("y")
    assert x.departure_s == 110.0 and x.t_rollout_s == 133.8
    assert y.departure_s is None and y.iterations == 5 and y.slo == 1.25
    assert y.spec_path == str(tmp_path / "jobs" / "y.toml")
    assert x.source_line == 4 and y.source_line == 10
    out = tmp_path / "again.toml"
    save_trace(trace, out)
    again = load_trace(out)
    strip = [(j.job_id, j.arrival_s, j.departure_s, j.kind, j.t_rollout_s, j.slo,
              j.iterations, j.spec_path) for j in again.jobs]
    assert strip == [(j.job_id, j.arrival_s, j.departure_s, j.kind, j.t_rollout_s, j.slo,
                      j.iterations, j.spec_path) for j in trace.jobs]


def test_wild_format_round_trip(tmp_path: Path) -> None:
    trace = load_trace("wild")
    out = tmp_path / "copy.trace"
    save_trace(trace, out, "wild")
    assert out.read_text() == resolve_trace_path("wild").read_text()
