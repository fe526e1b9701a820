"""``weave sacct``: its fields, output forms and time forms, and its usage mistakes (one
line, exit 2), without a daemon."""

from __future__ import annotations

import time

import pytest

from weave_slurm.cli.error_lines import USAGE_EXIT, run_app
from weave_slurm.cli.main import app
from weave_slurm.cli.sacct import FIELDS, duration, parse_format, render
from weave_slurm.cli.timespec import parse_time
from weave_slurm.errors import ConfigError

NOW = time.mktime((2026, 12, 1, 13, 30, 0, 0, 0, -1))   # local time, like sacct's


def _row(**more: object) -> dict[str, object]:
    row: dict[str, object] = {
        "job": 7, "name": "grpo-a", "user": "alice", "uid": 1000, "group": 3,
        "state": "COMPLETED", "submitted_s": NOW - 600, "started_s": NOW - 590,
        "ended_s": NOW - 10, "account": "rl-lab", "qos": None, "time_limit_min": 90,
        "slurm_job_ids": ["41", "42"], "gpu_s": {"rollout": 3600.0, "train": 2 * 3600.0},
        "node_s": {"rollout": 450.0, "train": 900.0},
        "phase_s": {"rollout": 61.25, "sync": 0.5, "train": 3700.0}, "cost": 12.345678,
        "updated_s": NOW - 10, "now": NOW}
    row.update(more)
    return row


@pytest.mark.parametrize(("text", "want"), [
    ("now", NOW), ("now-1hour", NOW - 3600), ("now-90minutes", NOW - 5400),
    ("now+2days", NOW + 2 * 86400), ("now-30", NOW - 30), ("NOW-1w", NOW - 604800),
    ("now-3h", NOW - 10800), ("now-1min", NOW - 60),
    ("2026-12-01", time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, -1))),
    ("2026-11-30T08:05", time.mktime((2026, 11, 30, 8, 5, 0, 0, 0, -1))),
    ("2026-11-30T08:05:09", time.mktime((2026, 11, 30, 8, 5, 9, 0, 0, -1))),
    ("09:15", time.mktime((2026, 12, 1, 9, 15, 0, 0, 0, -1))),
    ("midnight", time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, -1))),
    ("today", time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, -1))),
    ("noon", time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))),
])
def test_sacct_time_forms(text: str, want: float) -> None:
    assert parse_time(text, NOW) == want


@pytest.mark.parametrize(("text", "words"), [
    ("yesterday", "valid forms: YYYY-MM-DD[THH:MM[:SS]]"), ("now-1fortnight", "unit"),
    ("2026-13-01", "no such date"), ("25:00", "no such date"), ("2026-1-1", "valid forms"),
])
def test_bad_times_name_the_forms(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_time(text, NOW, "-S")
    assert str(err.value).startswith(f"-S: invalid time {text!r}; ") and words in str(err.value)


def test_format_names_ignore_case_and_take_widths() -> None:
    assert parse_format("jobid,JOBNAME%20,cost") == [("JobID", 8), ("JobName", 20),
                                                     ("Cost", 10)]
    with pytest.raises(ConfigError, match="unknown field 'bogus'; valid: JobID, JobName"):
        parse_format("jobid,bogus")


def test_parsable_lines_end_in_a_pipe_and_parsable2_does_not() -> None:
    fields = parse_format("JobID,Account,QOS,RolloutGPUHours,TrainGPUHours,GPUHours,Cost")
    lines = render([_row()], fields, parsable="|")
    assert lines == ["JobID|Account|QOS|RolloutGPUHours|TrainGPUHours|GPUHours|Cost|",
                     "7|rl-lab||1.0000|2.0000|3.0000|12.3457|"]
    assert render([_row()], fields, parsable="", header=False) == [
        "7|rl-lab||1.0000|2.0000|3.0000|12.3457"]


def test_table_has_header_dashes_and_fitted_cells() -> None:
    fields = parse_format("JobID,JobName%4,Elapsed,SlurmJobIDs,RolloutTime,TrainTime,"
                          "Timelimit,End")
    head, dashes, line = render([_row()], fields)
    assert head.split() == ["JobID", "Job+", "Elapsed", "SlurmJobIDs", "RolloutTime",
                            "TrainTime", "Timelimit", "End"]
    assert dashes.split() == ["-" * w for _, w in fields]
    assert line.split() == ["7", "grp+", "00:09:40", "41,42", "01:01.250", "01:01:40",
                            "01:30:00", "2026-12-01T13:29:50"]
    running = render([_row(ended_s=None, started_s=None)], parse_format("Elapsed,End"),
                     header=False)
    assert running[0].split() == ["00:00:00", "Unknown"]


def test_cost_header_names_the_currency_in_the_table_only() -> None:
    fields = parse_format("JobID,Cost")
    assert render([_row()], fields, currency="EUR")[0].split() == ["JobID", "Cost(EUR)"]
    assert render([_row()], fields, parsable="|", currency="EUR")[0] == "JobID|Cost|"


def test_state_and_name_filters_as_sacct(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """-s/--state (names or codes), --name, and -X (weave has no step lines)."""
    rows = [_row(), _row(job=8, name="grpo-b", state="FAILED"),
            _row(job=9, name="grpo-a", state="CANCELLED")]

    class Client:
        def __init__(self, path: object) -> None: ...
        def __enter__(self) -> Client:
            return self
        def __exit__(self, *exc: object) -> None: ...
        def call(self, op: object, **args: object) -> dict[str, object]:
            return {"jobs": rows, "now": NOW, "currency": "USD",
                    "partitions": {"rollout": "h20", "train": "h800"}}

    monkeypatch.setattr("weave_slurm.cli.sacct.DaemonClient", Client)
    argv = ["sacct", "-X", "-n", "-P", "-o", "JobID"]
    assert run_app(app, "weave", [*argv, "-s", "CD,f"]) == 0
    assert capsys.readouterr().out.split() == ["7", "8"]
    assert run_app(app, "weave", [*argv, "--name", "grpo-a"]) == 0
    assert capsys.readouterr().out.split() == ["7", "9"]
    assert run_app(app, "weave", [*argv, "--state", "cancelled", "--name", "grpo-a"]) == 0
    assert capsys.readouterr().out.split() == ["9"]
    assert run_app(app, "weave", [*argv, "-s", "DONE"]) == USAGE_EXIT
    assert "'--state'" in capsys.readouterr().err


def test_every_field_renders_a_minimal_record() -> None:
    assert len(render([_row()], [(f, w) for f, (w, _, _) in FIELDS.items()])) == 3


def test_durations_as_sacct_writes_them() -> None:
    assert duration(59.0) == "00:00:59" and duration(3 * 86400 + 3661) == "3-01:01:01"
    assert duration(0.25, millis=True) == "00:00.250"


@pytest.mark.parametrize(("argv", "words"), [
    (["sacct", "-o", "JobID,nope"], ("weave sacct: error:", "'--format'", "'nope'",
                                     "valid: JobID")),
    (["sacct", "-S", "soon"], ("weave sacct: error:", "'--starttime'", "'soon'",
                               "valid forms")),
    (["sacct", "-E", "now-1parsec"], ("'--endtime'", "unit 'parsec'")),
    (["sacct", "-j", "1,x"], ("'--jobs'", "'x' is not a job id")),
    (["sacct", "--bogus"], ("weave sacct: error:", "unrecognized option '--bogus'",
                            "--parsable")),
])
def test_usage_mistakes_are_one_line_exit_2(argv: list[str], words: tuple[str, ...],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(app, "weave", argv) == USAGE_EXIT
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and out.out == "", out
    for word in words:
        assert word in lines[0], lines[0]
