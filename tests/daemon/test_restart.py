"""Restart safety: weaved killed with SIGKILL at several moments and started again.

The daemon runs as a real subprocess on the local backend. After each kill and
restart: every submitted job is still there exactly once, every allocation the
backend holds belongs to a live group in the store (no orphans) and there is one
per (group, pool) (no duplicates), and running jobs keep running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.harness.waits import wait_for
from tests.harness.weaved import call, pings
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.slurm.local_backend import LocalBackend

LAUNCH = ("import typer; from weave_slurm.cli.daemon_cmd import daemon; typer.run(daemon)")


def start(state: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "--state-dir", str(state),
                             "--tick-s", "0.05", "--node-command", "sleep infinity"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sock = state / "weaved.sock"
    wait_for(lambda: pings(sock), 30, f"weaved answering on {sock}")
    return proc


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def check_world(state: Path, submitted: list[int]) -> dict[int, dict[str, object]]:
    sock = state / "weaved.sock"
    jobs = call(sock, Op.STATUS, all=True)["jobs"]
    ids = [j["job"] for j in jobs]
    assert sorted(ids) == sorted(submitted), "a job was lost or duplicated"
    groups = call(sock, Op.GROUPS)["groups"]
    held = {a["id"] for g in groups for a in g["allocations"] if a["state"] == "HELD"}
    backend = LocalBackend(state / "local")
    allocs = backend.list_allocations()
    names = Counter(a.name for a in allocs)
    assert all(n == 1 for n in names.values()), f"duplicate allocations: {names}"
    assert {a.alloc_id for a in allocs} <= held | {None}, "orphan allocation"
    return {j["job"]: j for j in jobs}


def test_kill9_at_several_moments_loses_nothing(public_dir: Path) -> None:
    state = public_dir / "state"
    submitted: list[int] = []
    proc = start(state)
    try:
        sock = state / "weaved.sock"
        # 1: killed right after accepting submissions (before or during placement)
        for i in range(3):
            submitted.append(call(sock, Op.SUBMIT, spec=job_spec_toml(f"j{i}"))["job"])
        kill9(proc)
        proc = start(state)
        wait_for(lambda: all(j["state"] == "RUNNING"
                             for j in call(sock, Op.STATUS)["jobs"]) and
                 len(call(sock, Op.STATUS)["jobs"]) == 3, 20, "the three jobs running")
        before = check_world(state, submitted)
        allocs_before = {a["id"] for g in call(sock, Op.GROUPS)["groups"]
                         for a in g["allocations"]}
        # 2: killed while idle with everything running: same allocations after restart
        kill9(proc)
        proc = start(state)
        time.sleep(0.5)  # several ticks
        after = check_world(state, submitted)
        assert {a["id"] for g in call(sock, Op.GROUPS)["groups"]
                for a in g["allocations"]} == allocs_before
        assert all(after[j]["state"] == "RUNNING" for j in submitted)
        assert [after[j]["group"] for j in submitted] == [before[j]["group"] for j in submitted]
        # 3: killed in the middle of a cancel and of new submissions, at staggered moments
        for delay_s in (0.0, 0.03, 0.08, 0.15):
            if delay_s == 0.0:
                call(sock, Op.CANCEL, jobs=[submitted[0]])
            submitted.append(call(sock, Op.SUBMIT, spec=job_spec_toml(f"k{delay_s}"))["job"])
            time.sleep(delay_s)
            kill9(proc)
            proc = start(state)
        wait_for(lambda: all(j["state"] in ("RUNNING", "PENDING")
                             for j in call(sock, Op.STATUS)["jobs"]), 20,
                 "every job running or pending")
        time.sleep(0.5)
        final = check_world(state, submitted)
        assert final[submitted[0]]["state"] == "CANCELLED"
        # the backend holds no step of the cancelled job
        backend = LocalBackend(state / "local")
        steps = [s.name for a in backend.list_allocations() for s in backend.list_steps(a.alloc_id)]
        assert not any(n.startswith(f"weave-j{submitted[0]}-") for n in steps)
        running = [j for j in submitted[1:] if final[j]["state"] == "RUNNING"]
        for j in running:
            assert sum(n.startswith(f"weave-j{j}-") for n in steps) == 2  # once per pool
    finally:
        for j in submitted:
            try:
                call(state / "weaved.sock", Op.CANCEL, jobs=[j])
            except Exception:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        backend = LocalBackend(state / "local")
        for a in backend.list_allocations(""):
            backend.release(a.alloc_id)
