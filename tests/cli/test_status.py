"""weave status / groups / cancel / show against an in-process weaved."""

from __future__ import annotations

import json

import pytest
import typer

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.cli.errors import run_app
from weave_slurm.cli.status import format_rows, mount
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import ConfigError

ROW = {"job": 7, "user": "alice", "uid": 1000, "name": "a-very-long-job-name-indeed",
       "group": 2, "state": "RUNNING", "phase": "idle", "iter": None, "slowdown": 1.25,
       "slo": 1.5, "time_s": 3725.0, "nodes": ["h20-0", "h800-0"], "reason": "",
       "submitted_s": 0.0}


def test_format_codes_and_presets() -> None:
    lines = format_rows([ROW], "%.5i %-6u %.4j %t %M %s %N")
    assert lines == ["JOBID USER   NAME ST TIME SLOWDOWN/SLO NODELIST",
                     "    7 alice  a-ve R 1:02:05 1.25/1.50 h20-0,h800-0"]
    assert format_rows([ROW], "ids", header=False) == ["7"]
    with pytest.raises(ConfigError, match="unknown code %Z"):
        format_rows([ROW], "%i %Z")


def _app() -> typer.Typer:
    app = typer.Typer()
    mount(app)
    return app


def test_status_groups_cancel_show(weaved: Running,  # noqa: F811
                                   capsys: pytest.CaptureFixture[str]) -> None:
    sock = weaved.socket
    ids = [call(sock, Op.SUBMIT, spec=job_spec_toml(f"j{i}"))["job"] for i in range(3)]
    wait_for(lambda: all(j["state"] == "RUNNING" for j in call(sock, Op.STATUS)["jobs"]), 20,
             "every job running")
    s = ["--socket", str(sock)]
    assert run_app(_app(), "weave", ["status", *s]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["JOBID", "USER", "NAME", "GROUP", "PHASE", "ITER",
                              "SLOWDOWN/SLO", "STATE", "TIME", "NODELIST"]
    assert len(out) == 4 and all("RUNNING" in line and "idle" in line for line in out[1:])
    assert run_app(_app(), "weave", ["status", "--json", "-j", str(ids[1]), *s]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in rows] == [ids[1]] and rows[0]["nodes"] == ["h20-0", "h800-0"]
    assert run_app(_app(), "weave", ["status", "-u", "nobody", "-o", "ids", *s]) == 0
    assert capsys.readouterr().out.strip() == "JOBID"
    assert run_app(_app(), "weave", ["status", "--watch", "--iterations", "2",
                                     "--interval", "0", "-o", "ids", "-h", *s]) == 0
    assert capsys.readouterr().out.count(f"\n{ids[2]}") >= 2

    assert run_app(_app(), "weave", ["groups", *s]) == 0
    g = capsys.readouterr().out.splitlines()
    assert len(g) == 2 and "1,2,3" in g[1] and "(h20:held)" in g[1] and "(h800:held)" in g[1]

    assert run_app(_app(), "weave", ["cancel", str(ids[0]), "4242", *s]) == 1
    assert "Invalid job id specified: 4242" in capsys.readouterr().err
    wait_for(lambda: call(sock, Op.STATUS, jobs=[ids[0]])["jobs"][0]["state"] == "CANCELLED",
             20, f"job {ids[0]} cancelled")
    assert run_app(_app(), "weave", ["cancel", str(ids[0]), *s]) == 1
    assert "already cancelled" in capsys.readouterr().err

    assert run_app(_app(), "weave", ["show", "job", str(ids[0]), *s]) == 0
    shown = capsys.readouterr().out
    assert "state=CANCELLED" in shown and "RUNNING->CANCELLING" in shown
    assert run_app(_app(), "weave", ["show", "group", "1", "--json", *s]) == 0
    assert json.loads(capsys.readouterr().out)["members"] == ids[1:]
    assert run_app(_app(), "weave", ["show", "partition", "1", *s]) == 2
