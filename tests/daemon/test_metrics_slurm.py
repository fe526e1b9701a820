"""weaved's metrics on the session's Slurm cluster (nodes on hosts of their own): the
allocations by partition while a job runs, and the weight syncs the two-tier transfer
made between the hosts once it is done."""

from __future__ import annotations

import os

import pytest

from tests.daemon.test_metrics import scrape, total, value
from tests.harness.hosts import weaved_dirs
from tests.harness.scratch import public_dir
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

STEPS = 3


def test_metrics_of_a_job_across_hosts(slurm_cluster: SessionCluster) -> None:
    env = dict(slurm_cluster.env)
    instance = f"mx{os.getpid()}"
    backend = SlurmCliBackend(env=env)
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir("weaved-slurm-mx-"):
        cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance,
                           tick_s=0.3, runtime=DriverKind.RL, client_timeout_s=5.0, env=env,
                           checkpoint_root=dirs.ckpt, metrics_port=0)
        with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
            sock, port = w.config.socket, w.metrics_port or 0
            wait_for(sock.exists, 30, "the API socket", interval_s=0.1)
            job = call(sock, Op.SUBMIT, spec=job_spec("mx", 3, STEPS), source="mx.toml")["job"]
            running = wait_for(lambda: scrape(port), 120, "the job running", interval_s=0.3,
                               until=lambda s: value(s, "weave_jobs", state="RUNNING") == 1)
            for role, partition in (("rollout", "h20"), ("train", "h800")):
                assert value(running, "weave_allocated_nodes", role=role,
                             partition=partition) == 1
                assert value(running, "weave_allocations", role=role, partition=partition,
                             state="HELD") == 1
            rows = wait_states(sock, [job], {"COMPLETED", "FAILED"}, 240, [])
            assert rows[0]["state"] == "COMPLETED", rows
            done = scrape(port)
            assert value(done, "weave_jobs", state="COMPLETED") == 1
            weights = w.driver.live(job)["measured"]["rollout_state_bytes"]
            # init + STEPS training steps, each synced h800 host -> h20 host (two-tier)
            assert value(done, "weave_syncs_total", what="weights") >= STEPS + 1
            assert value(done, "weave_sync_bytes_total", what="weights") \
                >= (STEPS + 1) * weights > 0
            assert value(done, "weave_sync_seconds_total", what="weights") > 0
            assert value(done, "weave_sync_bytes_total", what="trajectories") > 0
            assert total(done, "weave_placement_latency_seconds_count") >= 1
