"""DeepSpeed ZeRO-2 data parallel over two real gloo ranks (a training gang: the world
and LOCAL_RANK from the job's context) learns what one rank learns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from deepspeed_common import NEEDS_DEEPSPEED, SEED, STEPS, train

from weave_slurm.workloads.api import JobContext, JobRunner, Role
from weave_slurm.workloads.deepspeed_backend import DeepSpeedGrpoJob, clean_shm_leftovers
from weave_slurm.workloads.grpo_toy import GrpoToyJob

torch = pytest.importorskip("torch")
pytestmark = [*NEEDS_DEEPSPEED, pytest.mark.slow]


def _rank_child(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    os.environ.pop("LOCAL_RANK", None)   # the adapter takes it from the context
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    job = DeepSpeedGrpoJob()
    r = train(job, STEPS, gang={"rank": rank, "local_rank": rank, "world_size": 2,
                                "group": dist.group.WORLD}, engine={"zero_stage": 2})
    assert os.environ["LOCAL_RANK"] == str(rank)
    if rank == 0:
        torch.save(r.export_weights(), out)
    dist.barrier()
    job.close()
    dist.destroy_process_group()


def test_two_ranks_learn_what_one_rank_learns(tmp_path: Path) -> None:
    import torch.multiprocessing as tmp

    out = tmp_path / "weights.pt"
    tmp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        _rank_child, args=(str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    clean_shm_leftovers()
    two: dict[str, Any] = torch.load(out, weights_only=True)
    one = train(GrpoToyJob(), STEPS).export_weights()
    assert two.keys() == one.keys()
    assert max(float((two[k] - one[k]).abs().max()) for k in one) < 1e-5
    initial = JobRunner(GrpoToyJob(), JobContext("ds", Role.ROLLOUT, SEED)).export_weights()
    assert max(float((two[k] - initial[k]).abs().max()) for k in one) > 1e-3
