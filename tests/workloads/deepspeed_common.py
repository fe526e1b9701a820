"""What both DeepSpeed test files share: the skip rules and the training loop."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from weave_slurm.workloads.api import JobContext, JobRunner, Role
from weave_slurm.workloads.grpo_toy import GrpoToyJob

STEPS = 3
SEED = 11
NEEDS_DEEPSPEED = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="deepspeed (the 'deepspeed' extra) is not installed"),
]


def train(job: GrpoToyJob, steps: int, *, gang: dict[str, Any] | None = None,
          **options: object) -> JobRunner:
    """``steps`` rollout -> train iterations of ``job`` in one runner (seed ``SEED``);
    ``gang``: the context's rank, local_rank, world_size and group."""
    r = JobRunner(job, JobContext("ds", Role.TRAIN, SEED, dict(options), **(gang or {})))
    for _ in range(steps):
        r.train(r.rollout(r.weights_version))
    return r
