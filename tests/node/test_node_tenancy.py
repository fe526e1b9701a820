"""Device tenancy on one node daemon: before a phase of one member starts, every job
of another member whose last phase reported device memory held is switched out in its
resident worker; the same member moves nothing; a switch-out that fails or hangs
kills that worker and never blocks the incoming phase."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import pid_alive
from tests.harness.waits import wait_for
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.tenancy import PINNED, STAGING

pytestmark = pytest.mark.torch

ENTRY = """
import os, time

def hold(ctx):
    return {"device_held_bytes": 1 << 20, "pid": os.getpid()}

def nothing(ctx):
    return {"device_held_bytes": 0, "pid": os.getpid()}

def out(ctx):
    open(os.path.join(os.environ["WEAVE_JOB_DIR"], "..", "..", "out-" + ctx.job.job_id),
         "a").write("x")
    return {"device_held_bytes": 0, "host_bytes": 8192, "staging_bytes": 4096}

def fail(ctx):
    raise RuntimeError("cannot free the device")

def hang(ctx):
    time.sleep(600)
"""


@pytest.fixture
def entry(shm_root: Path) -> str:
    path = shm_root.parent / "tenancy_entry.py"
    path.write_text(ENTRY)
    path.chmod(0o644)
    return str(path)


def _run(c: NodeClient, job: str, entry: str, fn: str, tenant: str | None = None
         ) -> dict[str, Any]:
    extra = {} if tenant is None else {"tenant": tenant}
    c.call(Op.ACTIVATE, job=job, phase="train", entry=f"{entry}:{fn}", **extra)
    return dict(wait_for(lambda: c.call(Op.PHASE, job=job)["worker"], 60,
                         f"job {job}'s phase to end", interval_s=0.01,
                         until=lambda w: w["state"] != "running"))


def _outs(root: Path, job: str) -> int:
    path = root / f"out-{job}"
    return len(path.read_text()) if path.exists() else 0


def test_another_tenant_is_switched_out_first_and_its_pinned_memory_charged(
        resident_node: NodeDaemon, entry: str, shm_root: Path) -> None:
    resident_node.tenancy.entry = f"{entry}:out"
    with NodeClient(resident_node.config.socket) as c:
        a, b = c.register("a"), c.register("b")
        assert _run(c, "a", entry, "hold")["state"] == "exited"
        assert _run(c, "b", entry, "hold")["state"] == "exited"
        assert (_outs(shm_root, "a"), _outs(shm_root, "b")) == (1, 0)
        assert resident_node.budget.charged(a, PINNED) == 8192
        assert _run(c, "b", entry, "hold")["state"] == "exited"   # the same tenant again
        assert (_outs(shm_root, "a"), _outs(shm_root, "b")) == (1, 0)
        assert _run(c, "a", entry, "hold")["state"] == "exited"   # a back: b goes out
        assert (_outs(shm_root, "a"), _outs(shm_root, "b")) == (1, 1)
        assert resident_node.budget.charged(a, PINNED) == 0     # a's own phase ended it
        assert resident_node.budget.charged(a, STAGING) == 4096  # its worker keeps that
        assert resident_node.budget.charged(b, PINNED) == 8192
        status = c.call(Op.STATUS)
    assert status["device"]["switched"] == 2
    assert status["device"]["tenants"] == {"a": "a", "b": "b"}
    assert status["memory"]["per_job_bytes"]["b"] >= 8192 + 4096


def test_jobs_of_one_tenant_and_jobs_holding_nothing_are_not_switched(
        resident_node: NodeDaemon, entry: str, shm_root: Path) -> None:
    resident_node.tenancy.entry = f"{entry}:out"
    with NodeClient(resident_node.config.socket) as c:
        for job in ("g", "g.r1", "h"):
            c.register(job)
        _run(c, "g", entry, "hold", tenant="g")
        _run(c, "g.r1", entry, "hold", tenant="g")       # a rank of the same member
        assert _outs(shm_root, "g") == 0
        _run(c, "h", entry, "nothing")
        assert (_outs(shm_root, "g"), _outs(shm_root, "g.r1")) == (1, 1)
        _run(c, "g", entry, "hold", tenant="g")          # h held nothing
        assert _outs(shm_root, "h") == 0


@pytest.mark.parametrize("how", ["fail", "hang"])
def test_a_switch_out_that_fails_kills_that_worker_and_the_phase_runs(
        resident_node: NodeDaemon, entry: str, how: str) -> None:
    resident_node.tenancy.entry = f"{entry}:{how}"
    resident_node.tenancy.timeout_s = 2.0
    with NodeClient(resident_node.config.socket) as c:
        c.register("a")
        c.register("b")
        pid = int(_run(c, "a", entry, "hold")["result"]["pid"])
        start = time.monotonic()
        got = _run(c, "b", entry, "hold")
        assert got["state"] == "exited", got
        assert time.monotonic() - start < 30
        wait_for(lambda: not pid_alive(pid), 10, "the holder's worker to die")
        resident = wait_for(lambda: next(j for j in c.call(Op.STATUS)["jobs"]
                                         if j["job"] == "a")["resident"], 30,
                            "a's replacement worker", until=lambda r: r["restarts"] >= 1)
        assert resident["pid"] != pid
