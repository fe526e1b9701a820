"""DeepSpeed training backend for the reference job (``builtin:grpo-toy-deepspeed``).

Same job, same API, same rollout; the training step goes through a DeepSpeed engine
with ZeRO stage 1 or 2 around a plain ``torch.optim.Adam`` (DeepSpeed's own fused
optimizers JIT-compile C++ for minutes, so we never ask for them). On a CPU machine
DeepSpeed picks its CPU accelerator and gloo by itself.

Data parallel: with a process group of ``W`` ranks each rank takes every ``W``-th row
of each minibatch and DeepSpeed averages the gradients, so ``W`` ranks learn what one
rank learns. When no process group exists, a single-rank gloo group is created.

Optional extra: this module imports without deepspeed and raises ``ConfigError``
naming the extra when the backend is used. DeepSpeed may leave ``/dev/shm/deepspeed_*``
files behind: :func:`clean_shm_leftovers` removes them.
"""

from __future__ import annotations

import glob
import importlib
import io
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext
from weave_slurm.workloads.grpo_toy import GrpoToyJob

if TYPE_CHECKING:
    from torch import Tensor, nn

log = logging.getLogger(__name__)

ZERO_STAGES = (1, 2)
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


class DeepSpeedGrpoJob(GrpoToyJob):
    """:class:`GrpoToyJob` whose optimizer step is a DeepSpeed ZeRO engine step.

    Extra option: ``zero_stage`` (1 or 2, default 1).
    """

    def __init__(self) -> None:
        super().__init__()
        self._zero_stage = 1
        self._engine: Any = None
        self._rank = 0
        self._world = 1

    def setup(self, ctx: JobContext) -> None:
        options = dict(ctx.options)
        stage = options.pop("zero_stage", 1)
        if stage not in ZERO_STAGES or isinstance(stage, bool):
            raise ConfigError(f"options.zero_stage: unsupported value {stage!r} "
                              f"(valid: {', '.join(map(str, ZERO_STAGES))})")
        self._zero_stage = stage
        import_deepspeed()  # fail early, before the model is built
        super().setup(JobContext(ctx.job_id, ctx.role, ctx.seed, options))

    @property
    def zero_stage(self) -> int:
        return self._zero_stage

    def _make_trainer(self, policy: nn.Module) -> None:
        import torch
        import torch.distributed as dist

        deepspeed = import_deepspeed()
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
