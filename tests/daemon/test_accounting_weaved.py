"""Accounting end to end: weaved with the group runtime on the LocalBackend, a site that
charges its allocations to an account, QOS and time limit, two GRPO jobs run to the end;
``weave sacct`` then lists each member with its GPU-hours, which add up (with what the
group held while empty) to the GPU-time its allocations were held, and the records are
the same after a weaved restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.specs import job_spec
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, rl_config, serving, smoke_site, wait_states
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.states import AllocState
from weave_slurm.daemon.store import Store

pytestmark = pytest.mark.torch

SITE = """
[pools.rollout]
[pools.train]
[slurm]
account = "rl-lab"
qos = "normal"
time_limit_min = 60
"""


def held_gpu_s(store: Store, group: int) -> dict[str, float]:
    """GPU-seconds the group's allocations were held, straight from their transitions."""
    out = {"rollout": 0.0, "train": 0.0}
    for alloc in store.allocs(group, live_only=False):
        ts = {t.dst: t.ts for t in store.transitions("alloc", alloc.key)}
        if AllocState.HELD.value in ts:
            end = ts.get(AllocState.RELEASING.value, ts.get(AllocState.LOST.value))
            assert end is not None, alloc
            out[alloc.role] += (end - ts[AllocState.HELD.value]) * alloc.node_count \
                * alloc.gpus_per_node
    return out


def sacct(sock: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert run_app(app, "weave", ["sacct", "--socket", str(sock), *argv]) == 0
    return capsys.readouterr().out


def test_sacct_lists_each_member_with_its_share(capsys: pytest.CaptureFixture[str]) -> None:
    with public_dir("weaved-acct-") as public, shm_dir("weaved-acct-") as shm:
        (public / "site.toml").write_text(smoke_site(SITE))
        cfg = rl_config(public, shm, site_path=public / "site.toml")
        with serving(cfg) as w:
            sock = w.config.socket
            ids = [call(sock, Op.SUBMIT, spec=job_spec(f"acct-{i}", 40 + i, 2),
                        source=f"acct{i}.toml")["job"] for i in range(2)]
            local = cfg.state_dir / "local" / "local_backend.json"
            records: dict[str, Any] = settle(
                lambda: json.loads(local.read_text())["allocations"] if local.exists() else {},
                60, interval_s=0.2, until=lambda recs: len(recs) >= 2)   # h20 and h800
            assert {(r["account"], r["qos"], r["time_limit_min"]) for r in records.values()} \
                == {("rl-lab", "normal", 60)}
            running = settle(lambda: [r for r in call(sock, Op.STATUS, jobs=ids)["jobs"]
                                      if r["slurm_job_ids"]], 60, interval_s=0.2)
            assert set(running[0]["slurm_job_ids"]) <= set(records)
            rows = wait_states(sock, ids, {"COMPLETED", "FAILED"}, 240, [])
            assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
            group = rows[0]["group"]
            wait_for(lambda: w.store.usage_marks().get(group), 60,
                     f"group {group} booked to its end", interval_s=0.2,
                     until=lambda mark: mark is not None and mark.closed)
            held = held_gpu_s(w.store, group)
            mark = w.store.usage_marks()[group]
            report = json.loads(sacct(sock, capsys, "-j", ",".join(map(str, ids)), "--json"))
            table = sacct(sock, capsys, "-j", ",".join(map(str, ids)), "-o",
                          "JobID,JobName,Account,State,Elapsed,RolloutGPUHours,TrainGPUHours,"
                          "RolloutTime,SyncTime,TrainTime,Cost")
            with capsys.disabled():
                print(f"\n{table}held GPU-s per pool: {held}; unattributed: {mark.idle_gpu_s}")
            shown = call(sock, Op.SHOW, kind="job", id=ids[0])
            _check(report["jobs"], ids, held, mark.idle_gpu_s, w.store, group)
        assert shown["slurm_job_ids"] == report["jobs"][0]["slurm_job_ids"]
        with serving(cfg) as again:   # a restart reads the same records from the store
            settle(again.config.socket.exists, 30, interval_s=0.1)
            after = json.loads(sacct(again.config.socket, capsys, "-j",
                                     ",".join(map(str, ids)), "--json"))
            lines = sacct(again.config.socket, capsys, "-j", ",".join(map(str, ids)), "-p",
                          "-o", "JobID,Account,QOS,Timelimit,State,GPUHours").splitlines()
        assert [(r["job"], r["gpu_s"], r["cost"]) for r in after["jobs"]] == \
            [(r["job"], r["gpu_s"], r["cost"]) for r in report["jobs"]]
        assert lines[0] == "JobID|Account|QOS|Timelimit|State|GPUHours|"
        assert [line.split("|")[:5] for line in lines[1:]] == \
            [[str(j), "rl-lab", "normal", "01:00:00", "COMPLETED"] for j in ids]


def _check(jobs: list[dict[str, Any]], ids: list[int], held: dict[str, float],
           idle: dict[str, float], store: Store, group: int) -> None:
    assert [r["job"] for r in jobs] == ids
    alloc_ids = sorted({a.alloc_id for a in store.allocs(group, live_only=False)
                        if a.alloc_id}, key=int)
    for r in jobs:
        assert r["account"] == "rl-lab" and r["qos"] == "normal" and r["time_limit_min"] == 60
        assert r["gpu_s"]["rollout"] > 0 and r["gpu_s"]["train"] > 0, r
        assert r["phase_s"]["rollout"] > 0 and r["phase_s"]["train"] > 0, r
        assert r["slurm_job_ids"] == alloc_ids
        assert r["cost"] > 0
        # a member is charged at most the group's time in it, on every GPU of its pool
        in_group = r["ended_s"] - r["submitted_s"]
        assert r["gpu_s"]["train"] <= in_group * 8 + 1e-6
    for pool in ("rollout", "train"):
        booked = sum(r["gpu_s"][pool] for r in jobs) + idle[pool]
        assert booked == pytest.approx(held[pool], rel=1e-9), (pool, booked, held)
