"""TRL's ``GRPOTrainer`` as a hosted :class:`~weave_slurm.workloads.api.RLJob`.

The user builds their trainer as usual (model, tokenizer, dataset, reward functions,
``GRPOConfig``) in a function of the job's context; :class:`TrlGrpoJob` wraps it, and
weave runs its two halves as the member's phases (docs/job_api.md, "TRL"):

- **rollout** (``generate``): the prompts of step ``v`` (a permutation of the dataset
  drawn from ``(seed, epoch)``, as TRL's own sampler shuffles by epoch), each repeated
  ``num_generations`` times, through TRL's own generation and scoring
  (``GRPOTrainer._generate_and_score_completions``: sampling, reward functions,
  group-normalised advantages, reference log-probs when ``beta != 0``), with torch's
  RNG seeded from ``(seed, v)`` inside a forked RNG state. The batch's tensors are the
  trajectories; TRL's logged metrics (``reward``, ...) are the metrics, with
  ``reward_mean``.
- **train** (``update``): what ``Trainer.train`` does with one generation batch: a
  shuffle (seeded from ``(seed, step)``), ``steps_per_generation`` micro-batches for
  each of ``num_iterations`` passes, ``GRPOTrainer.compute_loss`` and a backward on
  each, and an optimizer step (gradient clipping, the trainer's own optimizer and
  LR scheduler) every ``gradient_accumulation_steps`` micro-batches. One ``update`` is
  one weight version.
- **warm state** (``state_tensors``/``load_state``): the policy (``policy.*``), the
  reference model if any (``reference.*``), the optimizer's tensors
  (``optim.<param>.<key>``) and one ``trl.meta`` tensor holding the rest
  (optimizer param groups, LR scheduler, step counters, the adaptive entropy
  coefficient), written with ``torch.save`` and read back ``weights_only``.

Why a hosted adapter rather than the cooperative gate: TRL's ``Trainer.train`` owns
its loop (dataloader, buffering of a generation batch over ``steps_per_generation``
steps) and has no phase boundary a gate could block at without patching that loop;
split at the two private methods above, the rollout and training halves run in
different processes on different pools and weave keeps the warm state, exactly as
for the built-in jobs.

Private TRL API is used (``_generate_and_score_completions``,
``current_gradient_accumulation_steps``, ``entropy_coef``, ``_last_world_entropy``,
``_metrics``), so the TRL version is pinned (:data:`TESTED_TRL`; the ``trl`` extra)
and a contract test (tests/workloads/test_trl_contract.py) fails, naming what
changed, when the installed version's internals differ. ``trl`` is imported only when
a job is set up.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Trajectories

if TYPE_CHECKING:
    import torch
    from torch import Tensor

log = logging.getLogger(__name__)

#: The TRL release (major, minor) whose private API this adapter was written against.
TESTED_TRL = (1, 16)
#: Tensors of TRL's generation batch that this adapter carries as trajectories; any
#: other key (multimodal inputs: pixel values, image counts) is refused.
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
              "old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps",
              "importance_sampling_ratio", "tool_mask")
#: Keys of TRL's batch that the adapter recomputes on the training side.
RECOMPUTED = ("num_items_in_batch",)
META_KEY = "trl.meta"
#: Metrics of TRL's that count over the process's life, not the step: left out so that
#: a rollout's metrics depend only on (seed, version, weights).
_CUMULATIVE = ("num_tokens",)

#: ``build(ctx) -> GRPOTrainer``: the user's trainer for this job instance.
TrainerBuilder = Callable[[JobContext], Any]


def check_trl_version(version: str) -> None:
    """Refuse a TRL release other than :data:`TESTED_TRL` (its private API may differ)."""
    parts = version.split(".")
    try:
        got = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise ConfigError(f"trl: cannot read version {version!r}") from None
    if got != TESTED_TRL:
        want = ".".join(map(str, TESTED_TRL))
        raise ConfigError(f"trl {version} is installed; the TRL adapter is tested with trl "
                          f"{want}.x only (it uses TRL's private GRPOTrainer API): install "
                          f"'weave-slurm[trl]' or trl=={want}.*")


def _derive_seed(seed: int, what: str, n: int) -> int:
    """A 63-bit seed for ``what`` at ``n`` (a version, an epoch, a step) of job ``seed``."""
    digest = hashlib.sha256(f"weave-trl:{seed}:{what}:{n}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class TrlGrpoJob:
    """A TRL ``GRPOTrainer`` as a hosted job; ``build(ctx)`` returns the trainer.

    ``build`` must build the same initial model from ``ctx.seed`` on every call (both
    roles start from identical weights, version 0), validate ``ctx.options`` strictly,
    and give ``GRPOConfig(max_steps=...)`` (the LR schedule's length) on a single CPU
    or GPU process: a role of this adapter is one rank.
    """

    def __init__(self, build: TrainerBuilder) -> None:
        self._build = build
        self._trainer: Any = None
        self._seed = 0
        self._step = 0      # updates done (the weight version of a fresh job)

    # -- set-up ---------------------------------------------------------------------
    def setup(self, ctx: JobContext) -> None:
        import trl

        check_trl_version(trl.__version__)
        if ctx.world_size != 1:
            raise ConfigError(f"job {ctx.job_id}: the TRL adapter runs a role as one rank; "
                              f"got world_size {ctx.world_size} (use gpus.train = 1 and "
                              "one rollout engine)")
        trainer = self._build(ctx)
        if not _is_grpo_trainer(trainer):
            raise ConfigError(f"job {ctx.job_id}: the builder returned "
                              f"{type(trainer).__name__}, not a trl.GRPOTrainer")
        args = trainer.args
        if args.use_vllm:
            raise ConfigError(f"job {ctx.job_id}: GRPOConfig(use_vllm=True) is not supported by "
                              "the hosted TRL adapter (generation runs through transformers)")
        if args.max_steps <= 0:
            raise ConfigError(f"job {ctx.job_id}: GRPOConfig.max_steps = {args.max_steps}: "
                              "give the number of steps (the LR schedule's length)")
        per_version = args.num_iterations * args.steps_per_generation
        if per_version % args.gradient_accumulation_steps:
            raise ConfigError(
                f"job {ctx.job_id}: num_iterations x steps_per_generation = {per_version} "
                f"micro-batches per rollout is not a multiple of "
                f"gradient_accumulation_steps = {args.gradient_accumulation_steps}")
        if trainer.accelerator.num_processes != 1:
            raise ConfigError(f"job {ctx.job_id}: the trainer spans "
                              f"{trainer.accelerator.num_processes} processes; the TRL "
                              "adapter runs one")
        trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        trainer.model.train()
        self._trainer, self._seed = trainer, ctx.seed

    @property
    def trainer(self) -> Any:
        """The wrapped ``GRPOTrainer`` (after :meth:`setup`)."""
        if self._trainer is None:
            raise StateError("TrlGrpoJob: setup() has not run")
        return self._trainer

    # -- rollout --------------------------------------------------------------------
    def prompt_rows(self, version: int) -> list[int]:
        """The dataset rows of the rollout at ``version`` (each once; TRL repeats them)."""
        import torch

        tr = self.trainer
        n_rows = len(tr.train_dataset)
        per = tr.args.generation_batch_size // tr.num_generations
        start = version * per
        rows: list[int] = []
        while len(rows) < per:
            epoch, at = divmod(start + len(rows), n_rows)
            if tr.shuffle_dataset:
                gen = torch.Generator().manual_seed(_derive_seed(self._seed, "epoch", epoch))
                order = torch.randperm(n_rows, generator=gen).tolist()
            else:
                order = list(range(n_rows))
            rows += order[at:at + per - len(rows)]
        return rows

    def generate(self, weights_version: int) -> Trajectories:
        import torch

        tr = self.trainer
        inputs = [dict(tr.train_dataset[i]) for i in self.prompt_rows(weights_version)
                  for _ in range(tr.num_generations)]
        tr.model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_derive_seed(self._seed, "rollout", weights_version))
            out = tr._generate_and_score_completions(inputs)
        tensors: dict[str, Tensor] = {}
        for key, value in out.items():
            if key in RECOMPUTED:
                continue
            if key not in BATCH_KEYS or not isinstance(value, torch.Tensor):
                raise StateError(f"TRL batch key {key!r} ({type(value).__name__}) is not "
                                 f"supported by the TRL adapter (valid: {', '.join(BATCH_KEYS)})")
            tensors[key] = value.detach().cpu().contiguous()
        metrics = self._drain_metrics()
        metrics["reward_mean"] = metrics.get("reward", float("nan"))
        return Trajectories(tensors, metrics)

    def _drain_metrics(self) -> dict[str, float]:
        """TRL's metrics of the phase that just ran (their mean), then forgotten."""
        logged = self.trainer._metrics["train"]
        got = {k: float(sum(v) / len(v)) for k, v in logged.items()
               if v and k not in _CUMULATIVE}
        logged.clear()
        return got

    # -- training -------------------------------------------------------------------
    def update(self, trajectories: Trajectories) -> Mapping[str, float]:
        import torch

        tr = self.trainer
        args = tr.args
        batch = dict(trajectories.tensors)
        rows = int(batch["prompt_ids"].shape[0])
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        gen = torch.Generator().manual_seed(_derive_seed(self._seed, "shuffle", self._step))
        order = torch.randperm(rows, generator=gen)
        chunks = order.chunk(args.steps_per_generation)
        if len(chunks) != args.steps_per_generation:
            raise StateError(f"TRL batch of {rows} rows cannot make "
                             f"{args.steps_per_generation} micro-batches")
        total = mask.sum()
        micro = [{**{k: v[idx] for k, v in batch.items()}, "num_items_in_batch": total}
                 for idx in chunks]
        tr.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        tr.model.train()
        losses: list[float] = []
        norms: list[float] = []
        window = 0.0
        for i in range(args.num_iterations * args.steps_per_generation):
            with tr.compute_loss_context_manager():
                loss = tr.compute_loss(tr.model, micro[i % args.steps_per_generation])
            tr.accelerator.backward(loss)
            window += float(loss.detach())
            if (i + 1) % args.gradient_accumulation_steps == 0:
                norms.append(self._optimizer_step())
                losses.append(window)
                window = 0.0
        self._step += 1
        metrics = self._drain_metrics()
        metrics.update(loss=sum(losses) / len(losses), grad_norm=sum(norms) / len(norms),
                       learning_rate=float(tr.lr_scheduler.get_last_lr()[0]))
        self._log({**dict(trajectories.metrics), **metrics})
        return metrics

    def _log(self, logs: dict[str, float]) -> None:
        """What TRL's own loop does every ``logging_steps`` steps: ``trainer.log`` (its
        metrics and callbacks: ``PrinterCallback`` prints the line to the job's stdout,
        which a hosted job's ``--output`` gets; ``report_to`` backends report it)."""
        args = self.trainer.args
        every = args.logging_steps
        if every < 1:   # a ratio of the run, as TRL's
            every = max(1, math.ceil(every * args.max_steps))
        if str(getattr(args.logging_strategy, "value", args.logging_strategy)) == "steps" \
                and self._step % int(every) == 0:
            self.trainer.log({k: v for k, v in logs.items() if k != "reward_mean"})

    def _optimizer_step(self) -> float:
        import torch

        tr = self.trainer
        norm = float("nan")
        if tr.args.max_grad_norm is not None and tr.args.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(tr.model.parameters(),
                                                        tr.args.max_grad_norm))
        tr.optimizer.step()
        tr.lr_scheduler.step()
        tr.optimizer.zero_grad(set_to_none=True)
        tr.state.global_step += 1
        return norm

    # -- weights --------------------------------------------------------------------
    def export_weights(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()}

    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        _load_module(self.trainer.model, tensors, "policy")

    # -- warm state -----------------------------------------------------------------
    def state_tensors(self) -> dict[str, Tensor]:
        tr = self.trainer
        state = {f"policy.{k}": v for k, v in self.export_weights().items()}
        if tr.ref_model is not None:
            state.update({f"reference.{k}": v.detach().clone()
                          for k, v in tr.ref_model.state_dict().items()})
        opt = tr.optimizer.state_dict()
        for param, values in opt["state"].items():
            for key, value in values.items():
                state[f"optim.{param}.{key}"] = _as_tensor(value, f"optimizer state {key!r}")
        meta = {"param_groups": opt["param_groups"], "scheduler": tr.lr_scheduler.state_dict(),
                "step": self._step, "global_step": tr.state.global_step,
                "entropy_coef": tr.entropy_coef, "last_world_entropy": tr._last_world_entropy}
        state[META_KEY] = _pack(meta)
        return state

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        tr = self.trainer
        if META_KEY not in tensors:
            raise StateError(f"TRL warm state lacks {META_KEY!r}")
        meta = _unpack(tensors[META_KEY])
        _load_module(tr.model, _strip(tensors, "policy."), "policy")
        if tr.ref_model is not None:
            _load_module(tr.ref_model, _strip(tensors, "reference."), "reference")
        opt_state: dict[int, dict[str, Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith("optim."):
                param, key = name[len("optim."):].split(".", 1)
                opt_state.setdefault(int(param), {})[key] = value.clone()
        tr.optimizer.load_state_dict({"state": opt_state, "param_groups": meta["param_groups"]})
        tr.lr_scheduler.load_state_dict(meta["scheduler"])
        self._step = int(meta["step"])
        tr.state.global_step = int(meta["global_step"])
        tr.entropy_coef = meta["entropy_coef"]
        tr._last_world_entropy = meta["last_world_entropy"]


def _is_grpo_trainer(obj: object) -> bool:
    from trl.trainer.grpo_trainer import GRPOTrainer

    return isinstance(obj, GRPOTrainer)


def _strip(tensors: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _load_module(module: torch.nn.Module, tensors: Mapping[str, Tensor], what: str) -> None:
    import torch

    want = set(module.state_dict())
    if set(tensors) != want:
        missing, extra = sorted(want - set(tensors)), sorted(set(tensors) - want)
        raise StateError(f"TRL {what} weights: missing {missing[:3]}, unexpected {extra[:3]}")
    with torch.no_grad():
        module.load_state_dict(dict(tensors), strict=True)


def _as_tensor(value: object, what: str) -> Tensor:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.tensor(value)
    raise StateError(f"TRL warm state: {what} is a {type(value).__name__}, not a tensor")


def _pack(obj: object) -> Tensor:
    """``obj`` (plain Python values) as one uint8 tensor."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _unpack(tensor: Tensor) -> Any:
    import torch

    data = tensor.detach().cpu().contiguous().numpy().tobytes()
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:   # torch raises several types for a corrupt pickle
        raise StateError(f"TRL warm state: {META_KEY!r} does not load: {exc}") from None
