"""weaved's metrics while real RL jobs run: two jobs co-execute on the LocalBackend's
node daemons and the endpoint shows their group's bubbles while they run, then the
weight syncs (bytes and time), the phase switches between them and the jobs' ends."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.daemon.test_metrics import scrape, total, value
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_config, serving, wait_states
from weave_slurm.daemon.protocol import Op

pytestmark = pytest.mark.torch

STEPS = 6


def test_metrics_of_two_jobs_in_one_group() -> None:
    with public_dir("weaved-mx-") as public, shm_dir("weaved-mx-") as shm, \
            serving(rl_config(public, shm, metrics_port=0)) as w:
        sock, port = w.config.socket, w.metrics_port or 0
        jobs = [call(sock, Op.SUBMIT, spec=job_spec(f"mx{i}", 7 + i, STEPS),
                     source=f"mx{i}.toml")["job"] for i in range(2)]
        live = wait_for(lambda: scrape(port), 180, "a running group's bubbles",
                        interval_s=0.2,
                        until=lambda s: total(s, "weave_group_bubble_ratio") > 0)
        for pool in ("rollout", "train"):
            assert 0.0 <= value(live, "weave_pool_bubble_ratio", pool=pool) <= 1.0
        rows = wait_states(sock, jobs, {"COMPLETED", "FAILED"}, 300, [])
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        assert rows[0]["group"] == rows[1]["group"]    # packed: they co-executed
        done = scrape(port)
        states = Counter(r["state"] for r in call(sock, Op.STATUS, all=True)["jobs"])
        for state in ("RUNNING", "COMPLETED", "FAILED"):
            assert value(done, "weave_jobs", state=state) == states.get(state, 0)
        assert value(done, "weave_placement_latency_seconds_count") >= 1
        # every training step's weights went to the rollout node: at least STEPS syncs
        # per job of more than a model's worth of bytes, and their time
        assert value(done, "weave_syncs_total", what="weights") >= 2 * STEPS
        weights_bytes = w.driver.live(jobs[0])["measured"]["rollout_state_bytes"]
        assert weights_bytes > 0
        assert value(done, "weave_sync_bytes_total", what="weights") \
            >= 2 * STEPS * weights_bytes
        assert value(done, "weave_sync_bytes_total", what="trajectories") > 0
        assert value(done, "weave_sync_seconds_total", what="weights") > 0
        # the two members alternate on the shared nodes: one waited for the other
        switches = total(done, "weave_phase_switch_seconds_count")
        assert switches >= 1
        assert 0 < total(done, "weave_phase_switch_seconds_sum") < 60 * switches
