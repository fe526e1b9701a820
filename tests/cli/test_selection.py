"""squeue's and scancel's job options on ``weave status`` and ``weave cancel``: -t, -p,
-n, -u, --me, -S, -l; the ST and NODELIST(REASON) columns; show's dates."""

from __future__ import annotations

import re

import pytest
import typer

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.selection import Selection, parse_states, selection, sort_rows, users_of
from weave_slurm.cli.status import format_rows, mount, ratio, show_pair
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import ConfigError


def _row(job: int, state: str, name: str = "a", **more: object) -> dict[str, object]:
    return {"job": job, "user": "u", "uid": 1, "name": name, "group": 1, "state": state,
            "phase": "-", "iter": None, "slowdown": None, "slo": 1.5, "time_s": float(job),
            "nodes": [], "reason": "", "submitted_s": 100.0 - job, "partitions": [], **more}


def test_states_by_name_code_case_and_all() -> None:
    assert parse_states(["R,pd", "Completed"]) == {JobState.RUNNING, JobState.PENDING,
                                                     JobState.COMPLETED}
    assert parse_states(["all"]) == frozenset(JobState)
    assert parse_states(None) == frozenset()
    with pytest.raises(ConfigError, match=r"--states: invalid job state 'RUNING'; valid: "
                       r"PENDING \(PD\), .*RUNNING \(R\).*, all"):
        parse_states(["RUNING"])
    assert Selection(parse_states(["CD"])).wants_ended
    assert not Selection(parse_states(["R", "PD"])).wants_ended


def test_a_selection_needs_every_filter() -> None:
    rows = [_row(1, "RUNNING", "x", partitions=["h20", "h800"]),
            _row(2, "PENDING", "x"), _row(3, "RUNNING", "y", partitions=["h20"])]
    pick = selection(["R"], ["h800"], ["x"])
    assert [r["job"] for r in rows if pick(r)] == [1]
    assert [r["job"] for r in rows if selection(None, ["h20"], None)(r)] == [1, 3]
    assert [r["job"] for r in rows if selection(None, None, ["x,y"])(r)] == [1, 2, 3]
    assert users_of(["a,b", "c"], False) == ["a", "b", "c"]
    assert len(users_of(None, True)) == 1


def test_sort_as_squeue_S() -> None:
    rows = [_row(1, "RUNNING", "b"), _row(2, "PENDING", "a"), _row(3, "RUNNING", "a")]
    assert [r["job"] for r in sort_rows(rows, None)] == [1, 2, 3]
    assert [r["job"] for r in sort_rows(rows, "-i")] == [3, 2, 1]
    assert [r["job"] for r in sort_rows(rows, "j,-i")] == [3, 2, 1]
    assert [r["job"] for r in sort_rows(rows, "t,+i")] == [2, 1, 3]      # PD before R
    assert [r["job"] for r in sort_rows(rows, "V")] == [3, 2, 1]         # submit time
    with pytest.raises(ConfigError, match="--sort: unknown key 'Z'"):
        sort_rows(rows, "Z")


def test_nodelist_reason_short_state_and_a_ratio_below_one() -> None:
    running = _row(7, "RUNNING", nodes=["h20-0", "h800-0"], slowdown=0.93)
    waiting = _row(8, "PLACED", reason="waiting for its allocations")
    head, r, w = format_rows([running, waiting], "%i %t %s %R")
    assert head.split() == ["JOBID", "ST", "SLOWDOWN/SLO", "NODELIST(REASON)"]
    assert r.split() == ["7", "R", "<1:0.93/1.50", "h20-0,h800-0"]
    assert w.split(maxsplit=3) == ["8", "CF", "-/1.50", "(waiting for its allocations)"]
    assert (ratio(1.0), ratio(1.25), ratio(None)) == ("1.00", "1.25", "-")
    assert show_pair("slowdown", 0.5) == "slowdown=<1:0.50"
    assert re.fullmatch(r"submitted=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d",
                        show_pair("submitted_s", 1.7e9))
    assert show_pair("time_s", 3725.0) == "time=1:02:05"
    assert show_pair("started_s", None) == "started=(null)"


def _app() -> typer.Typer:
    app = typer.Typer()
    mount(app)
    return app


def _ids(out: str) -> list[int]:
    return [int(line.split()[0]) for line in out.splitlines()[1:]]


def test_status_and_cancel_filters_on_weaved(weaved: Running,  # noqa: F811
                                             capsys: pytest.CaptureFixture[str]) -> None:
    sock = weaved.socket
    a, b, c = (call(sock, Op.SUBMIT, spec=job_spec_toml(n))["job"] for n in ("ja", "jb", "jc"))
    wait_for(lambda: all(j["state"] == "RUNNING" for j in call(sock, Op.STATUS)["jobs"]), 20,
             "every job running")
    s = ["--socket", str(sock)]

    def status(*argv: str) -> list[int]:
        assert run_app(_app(), "weave", ["status", *argv, *s]) == 0
        return _ids(capsys.readouterr().out)

    assert status("-t", "R") == [a, b, c]
    # weaved applies the filters: only the rows asked for come back
    rows = call(sock, Op.STATUS, states=["RUNNING"], names=["ja", "jc"],
                partitions=["h20"])["jobs"]
    assert [r["job"] for r in rows] == [a, c]
    with pytest.raises(ConfigError, match="'states' must be a list of strings"):
        call(sock, Op.STATUS, states="RUNNING")
    assert status("-t", "PD,CF") == []
    assert status("-n", "jb,jc", "-S", "-i") == [c, b]
    assert status("-p", "h20") == [a, b, c] and status("-p", "elsewhere") == []
    assert status("--me") == [a, b, c]            # root's jobs, asked as root
    assert status("-u", "nobody") == []
    assert run_app(_app(), "weave", ["status", "-l", *s]) == 0
    assert "LAYOUT" in capsys.readouterr().out.splitlines()[0]

    # scancel -n: only the job of that name (and only the caller's)
    assert run_app(_app(), "weave", ["cancel", "-n", "jb", *s]) == 0
    wait_for(lambda: call(sock, Op.STATUS, jobs=[b])["jobs"][0]["state"] == "CANCELLED", 20,
             f"job {b} cancelled")
    assert status("-t", "CA") == [b]              # an ended state lists ended jobs
    assert status() == [a, c]
    assert run_app(_app(), "weave", ["cancel", "-t", "PD", *s]) == 0   # nothing matches
    assert run_app(_app(), "weave", ["cancel", "-u", "nobody", "-t", "R", *s]) == 0
    assert status("-t", "R") == [a, c]            # nobody's jobs: none; ours untouched
    assert run_app(_app(), "weave", ["cancel", "-t", "R", str(c), *s]) == 0
    wait_for(lambda: call(sock, Op.STATUS, jobs=[c])["jobs"][0]["state"] == "CANCELLED", 20,
             f"job {c} cancelled")
    assert status() == [a]
    assert run_app(_app(), "weave", ["show", "job", str(a), *s]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert any(re.fullmatch(r"submitted=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", x) for x in shown)
