"""DeepSpeed training backend for the reference job (``builtin:grpo-toy-deepspeed``).

Same job, same API, same rollout; the training step goes through a DeepSpeed engine
with ZeRO stage 1 or 2 around a plain ``torch.optim.Adam`` (DeepSpeed's own fused
optimizers JIT-compile C++ for minutes, so we never ask for them). On a CPU machine
DeepSpeed picks its CPU accelerator and gloo by itself.

Engine settings come from the spec's ``[options.engine]`` table (``zero_stage``; the
top-level ``zero_stage`` option still works), the world from the job's context: a
training gang (``world_size`` ``W > 1``) must be the whole default torch.distributed
world, which DeepSpeed trains over (it takes no process group of its own), and
``LOCAL_RANK`` is the context's ``local_rank``. Each rank takes every ``W``-th row of
each minibatch and DeepSpeed averages the gradients, so ``W`` ranks learn what one
rank learns. A single-rank context keeps the older behaviour: the default world if
one exists (a ``torchrun``-style launch), else a single-rank gloo group it creates.

Optional extra: this module imports without deepspeed and raises ``ConfigError``
naming the extra when the backend is used. DeepSpeed may leave ``/dev/shm/deepspeed_*``
files behind: :func:`clean_shm_leftovers` removes them.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import io
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.grpo_toy import GrpoToyJob

if TYPE_CHECKING:
    from torch import Tensor, nn

log = logging.getLogger(__name__)

ZERO_STAGES = (1, 2)
#: Keys of ``[options.engine]`` for this backend.
ENGINE_KEYS = ("zero_stage",)
_STATE_KEY = "optim.deepspeed_zero"
_SHM_GLOB = "/dev/shm/deepspeed_*"


#: DeepSpeed's CPU accelerator JIT-compiles this C++ op (an intra-node shared-memory
#: allreduce) the first time a process group is wrapped: minutes of g++ on a busy
#: 2-core machine. It only speeds up multi-rank allreduce on one CPU host, so on the
#: CPU we mark it unavailable and DeepSpeed falls back to torch.distributed (gloo).
#: Set WEAVE_DEEPSPEED_SHM_OP=1 to let DeepSpeed build and use it.
_SHM_OP = "deepspeed_shm_comm"


def import_deepspeed() -> Any:
    """Import deepspeed or raise a ``ConfigError`` naming the extra."""
    try:
        deepspeed = importlib.import_module("deepspeed")
    except ImportError as exc:
        raise ConfigError(
            "entry point builtin:grpo-toy-deepspeed needs the 'deepspeed' extra "
            "(pip install -c constraints.txt 'weave-slurm[deepspeed]'): "
            f"import failed: {exc}") from None
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict) and os.environ.get("WEAVE_DEEPSPEED_SHM_OP") != "1":
        compatible[_SHM_OP] = False
    return deepspeed


def clean_shm_leftovers(pattern: str = _SHM_GLOB) -> list[str]:
    """Remove DeepSpeed's stray shared-memory files; returns the removed paths."""
    removed = []
    for path in glob.glob(pattern):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


def _ensure_process_group() -> None:
    """Create a single-rank gloo group if none exists.

    The group lives as long as the process: DeepSpeed caches it, so a process that
    destroyed it could not start another DeepSpeed job.

    DeepSpeed also insists on ``LOCAL_RANK``: it is taken from ``SLURM_LOCALID`` or,
    for a single rank, set to 0.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        log.info("deepspeed backend: created a single-rank gloo process group")
    if "LOCAL_RANK" not in os.environ:
        local = os.environ.get("SLURM_LOCALID") if dist.get_world_size() > 1 else "0"
        if local is None:
            raise ConfigError("LOCAL_RANK: not set for a multi-rank DeepSpeed group "
                              "(set it, or run under torchrun or srun)")
        os.environ["LOCAL_RANK"] = local


def _zero_stage(options: dict[str, Any]) -> int:
    """``[options.engine] zero_stage`` or the top-level ``zero_stage`` (popped)."""
    engine = options.pop("engine", {})
    if not isinstance(engine, Mapping):
        raise ConfigError(f"options.engine: expected a table, got {engine!r}")
    unknown = sorted(set(engine) - set(ENGINE_KEYS))
    if unknown:
        raise ConfigError(f"options.engine.{unknown[0]}: unknown key for "
                          f"builtin:grpo-toy-deepspeed (valid: {', '.join(ENGINE_KEYS)})")
    if "zero_stage" in engine and "zero_stage" in options:
        raise ConfigError("options.zero_stage: also given as options.engine.zero_stage; "
                          "give one")
    key = "options.engine.zero_stage" if "zero_stage" in engine else "options.zero_stage"
    stage = engine.get("zero_stage", options.pop("zero_stage", 1))
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ConfigError(f"{key}: unsupported value {stage!r} "
                          f"(valid: {', '.join(map(str, ZERO_STAGES))})")
    return int(stage)


def _engine_bytes(engine: Any) -> int:
    """What ``offload_states`` moves of an engine, counted (where no device allocator
    can be asked): its module's parameters and gradients, the optimizer's state
    tensors and its fp32 partitions."""
    tensors: list[Any] = []
    for p in engine.module.parameters():
        tensors.append(p)
        if p.grad is not None:
            tensors.append(p.grad)
    inner = getattr(engine.optimizer, "optimizer", None)
    for state in (getattr(inner, "state", {}) or {}).values():
        tensors.extend(v for v in state.values() if hasattr(v, "element_size"))
    tensors.extend(getattr(engine.optimizer, "single_partition_of_fp32_groups", []) or [])
    return sum(t.numel() * t.element_size() for t in tensors)


def _check_gang_world(ctx: JobContext) -> None:
    """DeepSpeed trains over the default world: a gang must be exactly that world."""
    import torch.distributed as dist

    world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else None
    if world != (ctx.rank, ctx.world_size):
        shown = "none" if world is None else f"rank {world[0]} of {world[1]}"
        raise ConfigError(f"job {ctx.job_id}: DeepSpeed trains over the default "
                          f"torch.distributed world, which must be the gang (rank "
                          f"{ctx.rank} of {ctx.world_size}); the default world is {shown}")


class DeepSpeedGrpoJob(GrpoToyJob):
    """:class:`GrpoToyJob` whose optimizer step is a DeepSpeed ZeRO engine step.

    Extra option: ``zero_stage`` (1 or 2, default 1), at the top level of the options
    or in their ``engine`` table.
    """

    def __init__(self) -> None:
        super().__init__()
        self._zero_stage = 1
        self._engine: Any = None
        self._rank = 0
        self._world = 1
        self._parked: list[tuple[Tensor, Tensor]] = []   # tensors off the device, by hand

    def setup(self, ctx: JobContext) -> None:
        options = dict(ctx.options)
        self._zero_stage = _zero_stage(options)
        if ctx.world_size > 1 and ctx.role is Role.TRAIN:
            _check_gang_world(ctx)
        import_deepspeed()  # fail early, before the model is built
        super().setup(dataclasses.replace(ctx, options=options))

    @property
    def zero_stage(self) -> int:
        return self._zero_stage

    def _make_trainer(self, policy: nn.Module) -> None:
        import torch
        import torch.distributed as dist

        deepspeed = import_deepspeed()
        if self.context.world_size > 1:
            os.environ["LOCAL_RANK"] = str(self.context.local_rank)
        else:
            _ensure_process_group()
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        opts = self.options
        rows = opts.prompts_per_step * opts.group_size // opts.minibatches
        if rows % self._world:
            raise ConfigError(f"options: minibatch of {rows} rows does not split over "
                              f"{self._world} ranks")
        config = {
            "train_micro_batch_size_per_gpu": rows // self._world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": opts.max_grad_norm,
            "zero_optimization": {"stage": self._zero_stage, "elastic_checkpoint": False},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        optimizer = torch.optim.Adam(policy.parameters(), lr=opts.lr)
        engine, *_ = deepspeed.initialize(model=policy, optimizer=optimizer, config=config,
                                          dist_init_required=False)
        self._engine = engine
        self._optim = None  # the engine owns the optimizer

    def close(self) -> None:
        """Drop the engine and clean DeepSpeed's /dev/shm leftovers (the group stays)."""
        self._engine = None
        clean_shm_leftovers()

    # -- the warm switch (OffloadsDevice) ---------------------------------------------
    def offload_device(self) -> int:
        """Free the device: the engine's ``offload_states()`` (ZeRO's optimizer states,
        fp32 master weights, the model's weights and gradients, to page-locked host
        memory on CUDA), the reference model (or a rollout's own policy) by hand.
        Returns the host bytes kept meanwhile."""
        import torch

        from weave_slurm.device.switch import module_tensors

        cuda = self.context.device.startswith("cuda")
        nbytes = 0
        if self._engine is not None:
            before = torch.cuda.memory_allocated() if cuda else 0
            self._engine.offload_states(pin_memory=cuda)
            nbytes = (before - torch.cuda.memory_allocated() if cuda
                      else _engine_bytes(self._engine))
        module = self._reference if self._engine is not None else (
            None if self._borrowed else self._policy)
        tensors = list(module_tensors(module, "m").values()) if module is not None else []
        self._parked = [(t, t.detach().to("cpu", copy=True).pin_memory() if cuda
                         else t.detach().clone()) for t in tensors]
        for t, _ in self._parked:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        return nbytes + sum(h.numel() * h.element_size() for _, h in self._parked)

    def reload_device(self, weights: Mapping[str, Tensor] | None) -> None:
        if self._engine is not None:
            self._engine.reload_states()
        for t, host in self._parked:
            t.data = host.to(t.device, copy=True) if host.device != t.device else host
        self._parked = []

    def _rows(self, start: int, stop: int) -> slice:
        return slice(start + self._rank, stop, self._world)

    def _train_model(self) -> nn.Module:
        if self._engine is None:
            raise StateError("grpo-toy-deepspeed: no engine (role is not train)")
        engine: nn.Module = self._engine
        return engine

    def _step(self, loss: Tensor) -> None:
        if self._engine is None:
            raise StateError("grpo-toy-deepspeed: no engine (role is not train)")
        self._engine.backward(loss)
        self._engine.step()

    def _optimizer_state(self) -> dict[str, Tensor]:
        """This rank's ZeRO optimizer partition, serialised into one uint8 tensor."""
        import torch

        if self._engine is None:
            return {}
        buf = io.BytesIO()
        torch.save(self._engine.optimizer.state_dict(), buf)
        return {_STATE_KEY: torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)}

    def _load_optimizer_state(self, tensors: Mapping[str, Tensor]) -> None:
        import torch

        if self._engine is None:
            return
        key = _STATE_KEY[len("optim."):]
        if key not in tensors:
            raise StateError(f"grpo-toy-deepspeed: warm state lacks {_STATE_KEY!r}")
        blob = tensors[key].numpy().tobytes()
        # our own blob, written by _optimizer_state of this job: trusted
        sd = torch.load(io.BytesIO(blob), weights_only=False)
        self._engine.optimizer.load_state_dict([sd] * self._world,
                                               load_optimizer_states=True,
                                               load_from_fp32_weights=True)
