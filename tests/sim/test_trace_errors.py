"""Corrupt traces: one-line ConfigErrors naming file and line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weave_slurm.errors import ConfigError
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.reference_traces import parse_event_lines
from weave_slurm.sim.toml_traces import parse_toml_trace
from weave_slurm.sim.traces import TraceFormat

GOOD = "a, 2025-01-01 00:00:00, 1, 7B_8k"


@pytest.mark.parametrize(("bad", "fmt", "pattern"), [
    ("a, 2025-01-01 00:00:00, 1", TraceFormat.WILD, r"t:2: 3 field\(s\).*expected 4"),
    ("b, 2025-01-01 00:00:01, 1, 7B_8k, x", TraceFormat.WILD, r"t:2: 5 field"),
    ("b, 2025-13-01 00:00:01, 1, 7B_8k", TraceFormat.WILD, r"t:2: time '2025-13-01.*YYYY"),
    ("b, 2025-01-01 00:00:01, 2, 7B_8k", TraceFormat.WILD, r"t:2: event '2' invalid"),
    ("a, 2025-01-01 00:00:05, 1, 7B_8k", TraceFormat.WILD, r"t:2: duplicate arrival.*line 1"),
    ("z, 2025-01-01 00:00:05, -1, 7B_8k", TraceFormat.WILD, r"t:2: departure of unknown job 'z'"),
    ("a, 2025-01-01 00:00:05, -1, 3B_4k", TraceFormat.WILD, r"t:2: departure kind '3B_4k'"),
    ("a, 2024-12-31 23:00:00, -1, 7B_8k", TraceFormat.WILD, r"t:2: .*before its arrival"),
    ("b, 2024-12-31 23:00:00, 1, 7B_8k", TraceFormat.WILD, r"t:2: time goes backwards"),
    ("b, 2025-01-01 00:00:01, 1, x, 5, 1.5", TraceFormat.PHILLY_PARSED,
     r"t:2: t_rollout_s 'x' invalid"),
    ("b, 2025-01-01 00:00:01, 1, 5, -1, 1.5", TraceFormat.PHILLY_PARSED,
     r"t:2: t_train_s '-1' invalid"),
    ("b, 2025-01-01 00:00:01, 1, 5, 5, nan", TraceFormat.PHILLY_PARSED, r"t:2: slo 'nan'"),
    ("b, 2025-01-01 00:00:01, 1, 5, 5, 0.9", TraceFormat.PHILLY_PARSED, r"t:2: slo '0.9'"),
])
def test_corrupt_line_names_file_and_line(bad: str, fmt: TraceFormat, pattern: str) -> None:
    first = GOOD if fmt is TraceFormat.WILD else "a, 2025-01-01 00:00:00, 1, 5, 5, 1.5"
    with pytest.raises(ConfigError, match=pattern) as info:
        parse_event_lines([first, bad], fmt, "t")
    assert "\n" not in str(info.value)


def test_second_departure_is_rejected() -> None:
    lines = [GOOD, "a, 2025-01-01 00:00:05, -1, 7B_8k", "a, 2025-01-01 00:00:06, -1, 7B_8k"]
    with pytest.raises(ConfigError, match=r"t:3: job 'a' departs twice"):
        parse_event_lines(lines, TraceFormat.WILD, "t")


def test_empty_file_and_unknown_kind(tmp_path: Path) -> None:
    empty = tmp_path / "empty.trace"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ConfigError, match="cannot tell the trace format"):
        load_trace(empty)
    with pytest.raises(ConfigError, match="no events"):
        load_trace(empty, fmt="wild")
    odd = tmp_path / "odd.trace"
    odd.write_text("a, 2025-01-01 00:00:00, 1, 9B_1k\n")
    pattern = r"odd.trace:1: job 'a' kind '9B_1k' not in .*valid: 3B_4k"
    with pytest.raises(ConfigError, match=pattern):
        load_trace(odd)


@pytest.mark.parametrize(("body", "pattern"), [
    ('version = 2\n[[job]]\nid = "a"\narrival_s = 0\n', "version = 2"),
    ('version = 1\nextra = 1\n[[job]]\nid = "a"\narrival_s = 0\n', r"unknown top-level.*extra"),
    ('version = 1\n[[job]]\nid = "a"\narival_s = 0\n', r":2: unknown key\(s\) \['arival_s'\]"),
    ('version = 1\n[[job]]\nid = "a"\n', r":2: job 'a': missing arrival_s"),
    ('version = 1\n[[job]]\nid = "a"\narrival_s = -1\n', r"arrival_s = -1"),
    ('version = 1\n[[job]]\nid = "a"\narrival_s = 0\nt_train_s = 1.0\n', "given together"),
    ('version = 1\n[[job]]\nid = "a"\narrival_s = 0\nlifetime_s = 5\niterations = 2\n', "both"),
    ('version = 1\n[[job]]\nid = "a"\narrival_s = 0\n\n[[job]]\nid = "a"\narrival_s = 1\n',
     r":6: duplicate job id 'a' \(first on line 2\)"),
    ('version = 1\n[[job]\n', "not valid TOML"),
])
def test_toml_errors(body: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_toml_trace(body, Path("x.toml"))


_field = st.one_of(
    st.sampled_from(["a", "b", "job1", "", "1", "-1", "0", "7B_8k", "3B_4k", "1.5", "nan",
                     "inf", "-3", "2025-01-01 00:00:00", "2025-01-01 00:00:09",
                     "2024-12-31 23:59:59", "2025-02-30 00:00:00"]),
    st.text(max_size=12))
_line = st.one_of(st.lists(_field, min_size=0, max_size=7).map(", ".join),
                  st.text(max_size=40))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_line, max_size=8), fmt=st.sampled_from(
    [TraceFormat.WILD, TraceFormat.PHILLY, TraceFormat.PHILLY_PARSED]))
def test_fuzzed_lines_give_config_error_or_a_trace(lines: list[str], fmt: TraceFormat) -> None:
    text = "\n".join(lines)
    try:
        trace = parse_event_lines(text.splitlines(), fmt, "fuzz.trace")
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.trace")
        assert "\n" not in message
    else:
        assert trace.events
        assert len({j.job_id for j in trace.jobs}) == len(trace.jobs)
        assert all(j.departure_s is None or j.departure_s >= j.arrival_s for j in trace.jobs)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzzed_toml_gives_config_error_or_a_trace(text: str) -> None:
    try:
        parse_toml_trace("version = 1\n[[job]]\n" + text, Path("f.toml"))
    except ConfigError as exc:
        assert str(exc).startswith("f.toml")
