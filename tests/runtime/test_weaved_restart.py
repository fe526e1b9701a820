"""A weaved restart re-attaches to a running group: the node daemons keep the warm
state, the member resumes from its newest node checkpoint and still ends with the
weights of its solo run, bit for bit."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.harness.solo import run_solo
from tests.runtime.test_weaved_local import OPTIONS, call, daemons_gone, job_spec, wait_states
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.runtime_view import weights_digest
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.backend import StepHandle

pytestmark = pytest.mark.torch

STEPS = 4


def start(cfg: DaemonConfig) -> tuple[Weaved, threading.Thread]:
    w = Weaved(cfg)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def test_restart_reattaches_and_matches_solo() -> None:
    public = Path(tempfile.mkdtemp(prefix="weaved-rs-"))
    public.chmod(0o755)
    shm = Path(tempfile.mkdtemp(prefix="weaved-rs-", dir="/dev/shm"))
    shm.chmod(0o711)
    cfg = DaemonConfig(state_dir=public / "state", tick_s=0.2, shm_root=shm,
                       client_timeout_s=5.0, runtime="rl")
    w, t = start(cfg)
    try:
        job = call(cfg.socket, Op.SUBMIT, spec=job_spec("rs", 5, STEPS), source="rs")["job"]
        end = time.monotonic() + 120
        while time.monotonic() < end:
            live = w.driver.live(job)
            if live is not None and live["version"] >= 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"job {job} did not reach version 2: {w.driver.live(job)}")
        allocs = {a.alloc_id for a in w.backend.list_allocations("")}
        w.stop()
        t.join(timeout=30)
        assert not t.is_alive()
        w, t = start(cfg)   # a fresh weaved on the same state dir
        assert {a.alloc_id for a in w.backend.list_allocations("")} == allocs  # adopted
        rows = wait_states(cfg.socket, [job], {"COMPLETED", "FAILED"}, 180, [])
        assert rows[0]["state"] == "COMPLETED", rows
        live = w.driver.live(job)
        assert live is not None and live["version"] == STEPS
        assert live["recoveries"] >= 1   # resumed from its checkpoint, not from scratch
        solo = run_solo(MemberSpec(str(job), seed=5, steps=STEPS, options=OPTIONS))
        assert live["weights_sha256"] == weights_digest(solo.weights)
        assert daemons_gone(cfg.state_dir.resolve() / "ckpt", 30)
    finally:
        w.stop()
        t.join(timeout=30)
        for a in w.backend.list_allocations(""):
            for s in w.backend.list_steps(a.alloc_id):
                w.backend.cancel_step(StepHandle(a.alloc_id, s.name, 0))
            w.backend.release(a.alloc_id)
        shutil.rmtree(public, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
