"""weaved restarts re-attach to a running group: the node daemons keep the warm
state, the member resumes from its newest node checkpoint and still ends with the
weights of its solo run, bit for bit; its recoveries are counted across the restarts."""

from __future__ import annotations

import functools

import pytest

from tests.harness.processes import daemons_gone
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, release_all, rl_config, serve, wait_states
from weave_slurm.daemon.protocol import Op
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytestmark = pytest.mark.torch

STEPS = 16   # enough steps left after version 2 that the stop comes first


def test_restart_reattaches_and_matches_solo() -> None:
    with public_dir("weaved-rs-") as public, shm_dir("weaved-rs-") as shm:
        cfg = rl_config(public, shm)
        served = serve(cfg)
        try:
            w = served.weaved
            job = call(cfg.socket, Op.SUBMIT, spec=job_spec("rs", 5, STEPS),
                       source="rs")["job"]
            allocs: set[str | None] = set()
            for version in (2, 4):   # two restarts: the recoveries add up (issue 33)
                wait_for(functools.partial(w.driver.live, job), 120, f"job {job} at version "
                         f"{version}", interval_s=0.1, until=lambda live, v=version:
                         live is not None and (live["version"] or 0) >= v)
                allocs = {a.alloc_id for a in w.backend.list_allocations("")}
                served.stop()
                assert not served.thread.is_alive()
                served = serve(cfg)   # a fresh weaved on the same state dir
                w = served.weaved
                assert {a.alloc_id for a in w.backend.list_allocations("")} == allocs
            rows = wait_states(cfg.socket, [job], {"COMPLETED", "FAILED"}, 180, [])
            assert rows[0]["state"] == "COMPLETED", rows
            live = w.driver.live(job)
            assert live is not None and live["version"] == STEPS
            # resumed from its checkpoint each time, not from scratch, and counted so
            assert live["recoveries"] == 2, live
            assert "after 2 recoveries" in rows[0]["reason"], rows
            solo = run_solo(MemberSpec(str(job), seed=5, steps=STEPS, options=OPTIONS))
            assert live["weights_sha256"] == weights_digest(solo.weights)
            assert daemons_gone(cfg.state_dir.resolve() / "ckpt", 30)
        finally:
            served.stop()
            release_all(served.weaved.backend)
