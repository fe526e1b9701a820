"""weave status / groups / cancel / show against an in-process weaved."""

from __future__ import annotations

import json

import pytest
import typer

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.status import format_rows, mount, share, show_pair
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


def test_array_columns_as_squeue() -> None:
    """%F and %K: an element's array job and task ids; N/A as task outside an array."""
    element = {**ROW, "job": 9, "id": "7_2"}
    assert format_rows([element, ROW], "%i %F %K", header=False) == ["7_2 7 2", "7 7 N/A"]
    assert format_rows([ROW], "%F %K")[0] == "ARRAY_JOB_ID ARRAY_TASK_ID"


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
                              "SLOWDOWN/SLO", "ST", "TIME", "NODELIST(REASON)"]
    assert len(out) == 4 and all(line.split()[7] == "R" and "idle" in line
                                 for line in out[1:])
    assert run_app(_app(), "weave", ["status", "--json", "-j", str(ids[1]), *s]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in rows] == [ids[1]] and rows[0]["nodes"] == ["h20-0", "h800-0"]
    assert run_app(_app(), "weave", ["status", "-u", "nobody", "-o", "ids", *s]) == 0
    assert capsys.readouterr().out.strip() == "JOBID"
    assert run_app(_app(), "weave", ["status", "--watch", "--iterations", "2",
                                     "--interval", "0", "-o", "ids", "-h", *s]) == 0
    assert capsys.readouterr().out.count(f"\n{ids[2]}") >= 2

    assert run_app(_app(), "weave", ["status", "-i", "0", "--iterations", "2", "-o", "ids",
                                     "-h", *s]) == 0            # squeue -i SECONDS
    assert capsys.readouterr().out.count(f"\n{ids[2]}") >= 2

    assert run_app(_app(), "weave", ["groups", *s]) == 0
    g = capsys.readouterr().out.splitlines()
    assert len(g) == 2 and "1,2,3" in g[1] and "(h20:held)" in g[1] and "(h800:held)" in g[1]
    assert g[0].split()[3:7] == ["H20", "H800", "PERIOD_S", "BUB_H20"]   # the site's names

    assert run_app(_app(), "weave", ["cancel", str(ids[0]), "4242", *s]) == 1
    assert "Invalid job id specified: 4242" in capsys.readouterr().err
    wait_for(lambda: call(sock, Op.STATUS, jobs=[ids[0]])["jobs"][0]["state"] == "CANCELLED",
             20, f"job {ids[0]} cancelled")
    assert run_app(_app(), "weave", ["cancel", str(ids[0]), *s]) == 0   # quiet, as scancel
    assert capsys.readouterr().err == ""
    assert run_app(_app(), "weave", ["cancel", "4242", "4243", *s]) == 1
    err = capsys.readouterr().err.splitlines()   # one prefix for every line
    assert [line.split(" error: ")[0] for line in err] == ["weave cancel:"] * 2, err

    assert run_app(_app(), "weave", ["show", "job", str(ids[0]), *s]) == 0
    shown = capsys.readouterr().out
    assert "state=CANCELLED" in shown and "RUNNING->CANCELLING" in shown
    assert run_app(_app(), "weave", ["show", "group", "1", "--json", *s]) == 0
    assert json.loads(capsys.readouterr().out)["members"] == ids[1:]
    assert run_app(_app(), "weave", ["show", "partition", "1", *s]) == 2


def test_status_long_and_show_job_print_each_members_layout(
        weaved: Running, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """16 training GPUs on 8-GPU nodes: 2 nodes x 8 ranks; 16 rollout GPUs in engines of
    2: 8 engines, 4 on each of 2 nodes (the local cluster has 2 + 2 nodes)."""
    sock = weaved.socket
    wide = call(sock, Op.SUBMIT, spec=job_spec_toml(
        "wide", rollout_gpus=16, train_gpus=16, engine_gpus=2,
        options={"sampling": "per_prompt"}))["job"]
    # both poolable: the default site pools rollout, and a job whose batch depends on
    # its engine count would wait for nodes of its own (the local cluster has no more)
    one = call(sock, Op.SUBMIT, spec=job_spec_toml(
        "one", rollout_gpus=1, train_gpus=1, options={"sampling": "per_prompt"}))["job"]
    wait_for(lambda: all(j["state"] == "RUNNING" for j in call(sock, Op.STATUS)["jobs"]), 20,
             "both jobs running")
    s = ["--socket", str(sock)]
    assert run_app(_app(), "weave", ["status", "-o", "long", *s]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[0].split()
    assert head[-2:] == ["LAYOUT", "REASON"]
    cells = {int(line.split()[0]): line.split()[head.index("LAYOUT")] for line in out[1:]}
    assert cells == {wide: "16r/2x8,8e/2x4,tp2", one: "1r/1x1,1e/1x1,tp1"}
    assert run_app(_app(), "weave", ["show", "job", str(wide), *s]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "layout=train 2x8 ranks; rollout 2x4 engines x 2 GPUs" in shown
    train = next(line for line in shown if line.startswith("layout.train="))
    assert train == "layout.train=h800-0:ranks=0-7 h800-1:ranks=8-15"
    rollout = next(line for line in shown if line.startswith("layout.rollout="))
    assert rollout == "layout.rollout=h20-0:engines=0-3 h20-1:engines=4-7 gpus_per_engine=2"
    assert "layout.pooling=poolable (any width)" in shown      # its sampling is per_prompt
    assert not any(line.startswith("layout.runs=") for line in shown)   # idle driver
    assert run_app(_app(), "weave", ["show", "job", str(wide), "--json", *s]) == 0
    lay = json.loads(capsys.readouterr().out)["layout"]
    assert lay["rollout"]["engines"] == 8 and lay["train"]["ranks_per_node"] == [8, 8]


def test_layout_cell_and_lines_without_a_stored_layout() -> None:
    from weave_slurm.cli.status import layout_cell, layout_lines

    assert layout_cell(ROW) == "-" and layout_lines(None) == []
    lay = {"words": "w", "runs": "only rank 0",
           "train": {"ranks": 9, "ranks_per_node": [5, 4],
                     "nodes": [{"node": "a", "ranks": [0, 4]}, {"node": None, "ranks": [5, 8]}]},
           "rollout": {"engines": 1, "engine_gpus": 4, "engines_per_node": [1],
                       "nodes": [{"node": "r", "pin": 0, "engines": [0, 0]}]}}
    assert layout_cell({"layout": lay}) == "9r/5+4,1e/1x1,tp4*"   # not all of it runs
    assert layout_cell({"layout": {**lay, "runs": None}}) == "9r/5+4,1e/1x1,tp4"
    assert layout_lines(lay) == ["layout=w", "layout.train=a:ranks=0-4 ?:ranks=5-8",
                                 "layout.rollout=r:engines=0 gpus_per_engine=4",
                                 "layout.runs=only rank 0"]
    assert layout_lines({**lay, "pooling": "not poolable: why"})[-1] == \
        "layout.pooling=not poolable: why"


def test_groups_marks_a_job_moving_out_and_in(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    def group(gid: int, members: list[int], out: list[int], in_: list[int]) -> dict:
        return {"group": gid, "state": "ACTIVE", "members": members, "moving_out": out,
                "moving_in": in_, "rollout_nodes": 1, "train_nodes": 1, "period_s": None,
                "rollout_bubble": None, "train_bubble": None, "allocations": []}
    answer = {"groups": [group(1, [3, 5], [3], []), group(2, [4], [], [3])]}
    monkeypatch.setattr("weave_slurm.cli.status._call", lambda *a, **k: answer)
    assert run_app(_app(), "weave", ["groups"]) == 0
    rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["1", "ACTIVE", "3>,5"], ["2", "ACTIVE", "4,>3"]]


def test_no_literal_none_and_compressed_node_lists() -> None:
    """REASON shows '-' (not 'None') when there is none; node lists are compressed as
    Slurm prints them; an idle share never reads '-0%'; scontrol's (null) for none."""
    pending = {**ROW, "nodes": [], "reason": None}
    assert format_rows([pending], "%R %r", header=False) == ["- -"]
    assert format_rows([{**pending, "reason": "Resources"}], "%R", header=False) == [
        "(Resources)"]
    four = {**ROW, "nodes": ["h20-0", "h20-1", "h20-3", "h800-0"]}
    assert format_rows([four], "%N %R", header=False) == [
        "h20-[0-1,3],h800-0 h20-[0-1,3],h800-0"]
    assert (share(-0.0004), share(0.5), share(None)) == ("0%", "50%", "-")
    assert show_pair("reason", None) == "reason=(null)"
    assert show_pair("nodes", ["h20-0", "h20-1"]) == "nodes=h20-[0-1]"


def test_groups_headers_name_the_sites_partitions(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    group = {"group": 1, "state": "ACTIVE", "members": [3], "moving_out": [], "moving_in": [],
             "rollout_nodes": 2, "train_nodes": 1, "period_s": 60.0,
             "rollout_bubble": -1e-9, "train_bubble": 0.25, "allocations": []}
    answer = {"groups": [group], "partitions": {"rollout": "infer", "train": "a100"}}
    monkeypatch.setattr("weave_slurm.cli.status._call", lambda *a, **k: answer)
    assert run_app(_app(), "weave", ["groups"]) == 0
    head, row = capsys.readouterr().out.splitlines()
    assert head.split()[3:8] == ["INFER", "A100", "PERIOD_S", "BUB_INFER", "BUB_A100"]
    assert row.split()[3:8] == ["2", "1", "60", "0%", "25%"]
    answer["groups"] = [{**group, "rollout_nodes": 4, "pool_gpus": 16}]   # a pool: its GPUs
    assert run_app(_app(), "weave", ["groups"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[3:5] == ["16g", "1"]


def test_show_job_prints_each_requeue_with_its_reason(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    why = "requeued (1 of max_requeues = 3): group 1 could not reach its node daemons"
    answer = {**ROW, "reason": why, "requeues": 1,
              "requeue_history": [{"ts": 0.0, "reason": why}], "transitions": []}
    monkeypatch.setattr("weave_slurm.cli.status._call", lambda *a, **k: answer)
    assert run_app(_app(), "weave", ["show", "job", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"reason={why}" in lines and "requeues=1" in lines
    (line,) = [x for x in lines if x.startswith("requeued=")]
    assert line.endswith(f" {why}") and not any(x.startswith("requeue_history") for x in lines)
