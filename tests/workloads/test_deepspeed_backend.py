"""The DeepSpeed training backend on CPU (gloo): same API, same learning as plain torch.

DeepSpeed keeps process-wide state (its accelerator, its cached process group), so the
DeepSpeed work runs in spawned child processes, never in the pytest process; the
children write their results to a file and the tests compare them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import pytest
from deepspeed_common import NEEDS_DEEPSPEED, SEED, STEPS, train

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.api import JobContext, JobRunner, Role
from weave_slurm.workloads.deepspeed_backend import DeepSpeedGrpoJob, clean_shm_leftovers
from weave_slurm.workloads.grpo_toy import GrpoToyJob

torch = pytest.importorskip("torch")
pytestmark = [*NEEDS_DEEPSPEED]


def _single_rank_child(out: str) -> None:
    """One process, world of 1: ZeRO-1, ZeRO-2, and a warm-state round trip."""
    os.environ["LOCAL_RANK"] = "0"
    result: dict[str, Any] = {}
    for stage in (1, 2):   # ZeRO-2 through the spec's [options.engine] table
        job = DeepSpeedGrpoJob()
        r = (train(job, STEPS, zero_stage=1) if stage == 1
             else train(job, STEPS, engine={"zero_stage": 2}))
        result[f"stage{stage}"] = r.export_weights()
        result[f"stage{stage}_version"] = r.weights_version
        result[f"stage{stage}_engine"] = job._engine.zero_optimization_stage()
        job.close()
    a = train(DeepSpeedGrpoJob(), 2, zero_stage=1)
    state = {k: v.clone() for k, v in a.state_tensors().items()}
    result["state_keys"] = sorted(state)
    b = JobRunner(DeepSpeedGrpoJob(), JobContext("ds", Role.TRAIN, SEED, {"zero_stage": 1}))
    b.load_state(state)
    result["restored_version"] = b.weights_version
    for r in (a, b):
        r.train(r.rollout(r.weights_version))
    result["continued_a"], result["continued_b"] = a.export_weights(), b.export_weights()
    job = DeepSpeedGrpoJob()      # the warm switch: offload_states / reload_states
    c = JobRunner(job, JobContext("ds", Role.TRAIN, SEED, {"zero_stage": 1}))
    moved = []
    for _ in range(STEPS):
        c.train(c.rollout(c.weights_version))
        moved.append(job.offload_device())
        result.setdefault("parked_empty", all(t.numel() == 0 for t, _ in job._parked))
        job.reload_device(None)
    result["offloaded"], result["offload_bytes"] = c.export_weights(), moved
    torch.save(result, out)


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def single_rank(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ds") / "result.pt"
    proc = mp.get_context("spawn").Process(target=_single_rank_child, args=(str(out),))
    proc.start()
    proc.join(timeout=900)
    clean_shm_leftovers()
    assert proc.exitcode == 0, f"DeepSpeed child failed (exit {proc.exitcode})"
    result: dict[str, Any] = torch.load(out, weights_only=True)
    return result


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:
    return train(GrpoToyJob(), STEPS).export_weights()


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stage_learns_what_plain_torch_learns(
        stage: int, single_rank: dict[str, Any], plain: dict[str, Any]) -> None:
    weights = single_rank[f"stage{stage}"]
    assert single_rank[f"stage{stage}_version"] == STEPS
    assert single_rank[f"stage{stage}_engine"] == stage
    initial = JobRunner(GrpoToyJob(), JobContext("ds", Role.ROLLOUT, SEED)).export_weights()
    assert _max_diff(weights, initial) > 1e-3  # it did train
    assert _max_diff(weights, plain) < 1e-5


def test_warm_state_round_trip_continues_identically(single_rank: dict[str, Any]) -> None:
    assert "optim.deepspeed_zero" in single_rank["state_keys"]
    assert single_rank["restored_version"] == 2
    assert _max_diff(single_rank["continued_a"], single_rank["continued_b"]) == 0.0


def test_offloading_between_steps_learns_the_same(single_rank: dict[str, Any]) -> None:
    assert _max_diff(single_rank["offloaded"], single_rank["stage1"]) == 0.0
    assert single_rank["parked_empty"] is True      # the reference left its memory
    params = sum(v.numel() * v.element_size() for v in single_rank["stage1"].values())
    assert all(n > 2 * params for n in single_rank["offload_bytes"]), \
        (single_rank["offload_bytes"], params)      # engine + Adam + reference bytes


def test_bad_zero_stage_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"zero_stage.*valid: 1, 2"):
        JobRunner(DeepSpeedGrpoJob(), JobContext("ds", Role.TRAIN, 0, {"zero_stage": 3}))


@pytest.mark.parametrize(("options", "needle"), [
    ({"engine": {"zero_stage": 3}}, r"options\.engine\.zero_stage: unsupported value 3 "
     r"\(valid: 1, 2\)"),
    ({"engine": {"stage": 2}}, r"options\.engine\.stage: unknown key .*valid: zero_stage"),
    ({"engine": {"zero_stage": 2}, "zero_stage": 2}, r"also given as options\.engine"),
    ({"engine": 2}, r"options\.engine: expected a table, got 2"),
])
def test_bad_engine_options_are_config_errors_naming_the_key(
        options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        JobRunner(DeepSpeedGrpoJob(), JobContext("ds", Role.TRAIN, 0, options))


def test_a_gang_must_be_the_default_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("this process already has a default torch.distributed world")
    with pytest.raises(ConfigError, match=r"must be the gang \(rank 1 of 2\); the default "
                                          r"world is none"):
        JobRunner(DeepSpeedGrpoJob(), JobContext("ds", Role.TRAIN, 0, rank=1, world_size=2))

