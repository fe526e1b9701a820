"""weaved's node daemons on the local backend (issue 33, defect 6): they outlive a
weaved that stops (a restart re-attaches to them), but not their allocation: once its
record in the local backend's state is gone (released, or the state dir removed) they
end within their watch interval and leave nothing in /dev/shm."""

from __future__ import annotations

import functools
import shutil

import pytest

from tests.harness.processes import daemons_gone, pids_naming
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, release_all, rl_config, serve
from weave_slurm.daemon.protocol import Op

pytestmark = pytest.mark.torch


def test_node_daemons_end_once_a_stopped_weaveds_state_dir_is_gone() -> None:
    with public_dir("weaved-nd-") as public, shm_dir("weaved-nd-") as shm:
        cfg = rl_config(public, shm)
        marker = cfg.state_dir.resolve() / "ckpt"   # on the node daemons' command lines
        served = serve(cfg)
        try:
            job = call(cfg.socket, Op.SUBMIT, spec=job_spec("nd", 3, 40), source="nd")["job"]
            wait_for(functools.partial(served.weaved.driver.live, job), 120,
                     f"job {job} at version 1", interval_s=0.1,
                     until=lambda live: live is not None and (live["version"] or 0) >= 1)
            served.stop()   # the node daemons and the job's state stay, for a restart
            assert pids_naming(marker), "the node daemons ended with weaved"
            assert [p for p in shm.rglob("*") if p.is_file()]
            shutil.rmtree(cfg.state_dir)
            assert daemons_gone(marker, 20)
            assert [p for p in shm.rglob("*") if p.is_file()] == []
        finally:
            served.stop()
            release_all(served.weaved.backend)
