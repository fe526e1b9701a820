"""A job's own time limit with the real group runtime (weaved on the LocalBackend, real
node daemons and GRPO workers): two jobs share a group; once the one with
``time_limit_min = 1`` has run a minute (weaved's clock moved on instead of waiting),
weaved ends it as Slurm's TIMEOUT, its member leaves the group, the other runs on to
COMPLETED, and the first one's ``--output`` file holds its lines."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_config, serving, wait_states
from weave_slurm.daemon.protocol import Op

pytestmark = pytest.mark.torch


class _Later:
    """The system clock, ``offset_s`` ahead."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    def now(self) -> float:
        return time.time() + self.offset_s

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def sleep_until(self, time_s: float) -> None:
        time.sleep(max(0.0, time_s - self.now()))


def test_a_job_past_its_time_limit_is_ended_and_its_group_runs_on() -> None:
    with public_dir("weaved-tl-") as public, shm_dir("weaved-tl-") as shm:
        out = public / "long-%j.out"
        long_spec = job_spec("long", 7, 500) + f'\n[slurm]\ntime_limit_min = 1\noutput = "{out}"\n'
        with serving(rl_config(public, shm)) as w:
            sock = w.config.socket
            long_job = call(sock, Op.SUBMIT, spec=long_spec, source="long.toml")["job"]
            short = call(sock, Op.SUBMIT, spec=job_spec("short", 8, 3), source="s.toml")["job"]
            rows = wait_states(sock, [long_job, short], {"RUNNING"}, 120, [])
            assert rows[0]["group"] == rows[1]["group"]   # one charge: one group
            wait_for(lambda: call(sock, Op.STATUS, jobs=[long_job])["jobs"][0]["iter"], 120,
                     "the long job's first step", interval_s=0.3,
                     until=lambda it: isinstance(it, str) and not it.startswith("0/"))
            w.reconciler.clock = _Later(61.0)   # a minute on, for the loop only
            (row,) = wait_states(sock, [long_job], {"FAILED", "COMPLETED"}, 60, [])
            assert row["state"] == "FAILED", row
            assert row["reason"].startswith("reached its time limit (1 min, #SBATCH --time")
            (other,) = wait_states(sock, [short], {"COMPLETED", "FAILED"}, 240, [])
            assert other["state"] == "COMPLETED", other
        lines = Path(str(out).replace("%j", str(long_job))).read_text().splitlines()
        said = "\n".join(lines)   # whole: pytest cuts a long list's repr
        assert any(": RUNNING: " in line for line in lines), said
        # the newest step at each tick of weaved's (job_output._progress): not always 1
        assert any(re.search(r": step [1-9][0-9]*/500\b", line) for line in lines), said
        assert "FAILED: reached its time limit" in lines[-1], said
