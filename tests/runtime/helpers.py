"""Shared checks of the runtime tests (bit-identity against a solo run)."""

from __future__ import annotations

import os

import torch

from tests.harness.solo import run_solo
from weave_slurm.node.client import NodeClient
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.runner import GroupRunner

#: Small and fast: the default toy model, 4 prompts x 4 samples.
OPTIONS = {"prompts_per_step": 4, "group_size": 4}


def members(n: int, steps: int, prefix: str) -> list[MemberSpec]:
    return [MemberSpec(f"{prefix}{i}", seed=11 + i, steps=steps, options=OPTIONS)
            for i in range(n)]


def group_weights(ex: GroupRunner, job_id: str) -> dict[str, torch.Tensor]:
    node = ex.members[job_id].train_node
    with NodeClient(node.socket_path) as client:
        seg = client.attach(JobRef(job_id, os.getuid()))["weights"]
    return {k: v.clone() for k, v in seg.tensors.items()}


def assert_same_as_solo(ex: GroupRunner, spec: MemberSpec) -> None:
    solo = run_solo(spec)
    got = group_weights(ex, spec.job_id)
    assert sorted(got) == sorted(solo.weights)
    differ = [k for k, v in solo.weights.items() if not torch.equal(got[k], v)]
    assert differ == [], f"{spec.job_id}: tensors differ from the solo run: {differ[:3]}"
    assert ex.members[spec.job_id].version == solo.version == spec.steps
    assert tuple(ex.members[spec.job_id].rewards) == solo.rewards
