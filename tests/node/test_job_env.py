"""The environment of a job's processes (node/job_env.py): Slurm's and torchrun's
variables for its place, never the node daemon's own step's."""

from __future__ import annotations

import os
from unittest import mock

from weave_slurm.node.job_env import apply, job_environment

DAEMON = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "h800-[0-1]", "SLURM_STEP_ID": "3",
          "SLURM_PROCID": "0", "SLURM_CLUSTER_NAME": "weave"}


def test_a_gang_rank_gets_its_place_and_where_its_world_meets() -> None:
    env = job_environment(node="h800-1", job_name="grpo", rank=5, local_rank=1,
                          world_size=8, init_method="tcp://10.7.0.2:29511",
                          daemon_env=DAEMON)
    assert env == {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "h800-[0-1]",
                   "SLURM_CLUSTER_NAME": "weave", "SLURMD_NODENAME": "h800-1",
                   "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
                   "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
                   "SLURM_JOB_NAME": "grpo", "MASTER_ADDR": "10.7.0.2", "MASTER_PORT": "29511"}


def test_one_process_and_no_allocation_outside_slurm() -> None:
    env = job_environment(node="n0", job_name=None, daemon_env={})
    assert env == {"SLURMD_NODENAME": "n0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                   "SLURM_NTASKS": "1"}          # no torchrun variables without a world


def test_apply_drops_the_daemons_step_variables() -> None:
    with mock.patch.dict(os.environ, {"SLURM_STEP_ID": "3", "SLURM_NODEID": "0"}):
        apply({"RANK": "2"})
        assert os.environ["RANK"] == "2"
        assert "SLURM_STEP_ID" not in os.environ and "SLURM_NODEID" not in os.environ
    assert os.environ.get("RANK") != "2"          # the test process's environment is back


def test_cuda_visible_devices_is_the_members_gpus_on_the_node() -> None:
    """weave's assignment (0..n-1) on a node whose allocation named no GPUs; the first n
    of the allocation's own where it did; the node's list kept across a resident
    worker's phases (its own CUDA_VISIBLE_DEVICES changed after the first)."""
    def cvd(gpus: int, source: dict[str, str]) -> dict[str, str]:
        env = job_environment(node="h800-0", job_name=None, daemon_env=source, gpus=gpus)
        return {k: v for k, v in env.items() if k in ("CUDA_VISIBLE_DEVICES",
                                                      "WEAVE_NODE_GPUS")}
    assert cvd(2, {}) == {"CUDA_VISIBLE_DEVICES": "0,1", "WEAVE_NODE_GPUS": ""}
    slurm = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    first = cvd(2, slurm)
    assert first == {"CUDA_VISIBLE_DEVICES": "4,5", "WEAVE_NODE_GPUS": "4,5,6,7"}
    assert cvd(3, {**slurm, **first}) == {"CUDA_VISIBLE_DEVICES": "4,5,6",
                                          "WEAVE_NODE_GPUS": "4,5,6,7"}
    assert cvd(1, cvd(2, {})) == {"CUDA_VISIBLE_DEVICES": "0", "WEAVE_NODE_GPUS": ""}
    assert "CUDA_VISIBLE_DEVICES" not in job_environment(node="n", job_name=None,
                                                         daemon_env=slurm)   # not known
