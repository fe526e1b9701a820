"""The built-in reference job (``builtin:grpo-toy``): a tiny Llama learns a digit task by GRPO.

The model is a causal LM from ``transformers.LlamaConfig`` with random weights, built
deterministically from the job seed (no download, no tokenizer: the job works on token
ids). A sequence is ``BOS, prompt digits, SEP, response digits``; all have the same
length, so no padding or attention mask is needed. The policy acts over the ten digit
tokens only (constrained decoding).

Determinism: ``generate`` draws prompts and samples with a generator seeded from
``(seed, weights_version)`` and depends otherwise only on the weights; ``update``
depends only on the batch and the training state (weights, reference, optimizer). So
two instances fed the same weights produce bit-identical batches, whatever process
they live in.

Long-tailed variant (``response_len_max > 0``; off by default): the policy may also
end its response (an end-of-sequence action, token ``SEP``), and request ``i`` of the
rollout at version ``v`` stops at the latest at a cap drawn from a Pareto distribution
seeded by ``(seed, v, i)`` (:func:`~weave_slurm.workloads.tasks.length_caps`).
Finished rows leave the decode batch, so the work really shrinks and the last few
requests decode alone: the long tail that long-tail migration overlaps
(docs/runtime.md). ``generate`` reports the requests still decoding through
:func:`~weave_slurm.workloads.api.report_progress`; that changes nothing it computes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Role, Trajectories, report_progress
from weave_slurm.workloads.grpo import GrpoHyper, action_logprobs, group_advantages, grpo_loss
from weave_slurm.workloads.tasks import (
    EOS_ACTION,
    NUM_DIGITS,
    DigitTask,
    TaskKind,
    length_caps,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

log = logging.getLogger(__name__)

BOS_ID = 1
SEP_ID = 2
DIGIT_BASE_ID = 16  # token id of digit 0; digits are DIGIT_BASE_ID .. DIGIT_BASE_ID + 9
_SEED_MIX = 1_000_003


@dataclass(frozen=True)
class GrpoToyOptions:
    """The job's options (the ``options`` table of its job spec). Defaults: the fast config."""

    task: str = "copy"
    prompt_len: int = 4
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    prompts_per_step: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float = 1e-3
    clip_eps: float = 0.2
    kl_coef: float = 0.02
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    num_threads: int = 1
    response_len_max: int = 0          # > 0: long-tailed responses of at most this length
    length_tail_alpha: float = 1.2     # Pareto shape of the per-request length caps

    @property
    def long_tail(self) -> bool:
        return self.response_len_max > 0

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> GrpoToyOptions:
        """Strict parse: unknown keys and wrongly typed values are ``ConfigError``."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"options: unknown key {unknown[0]!r} for builtin:grpo-toy "
                              f"(valid: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for name, value in options.items():
            default = getattr(cls, name)
            if isinstance(default, float) and isinstance(value, int) \
                    and not isinstance(value, bool):
                value = float(value)
            if type(value) is not type(default):
                raise ConfigError(f"options.{name}: expected {type(default).__name__}, "
                                  f"got {value!r}")
            values[name] = value
        opts = cls(**values)
        opts.validate()
        return opts

    def validate(self) -> None:
        TaskKind.parse(self.task, "options.task")
        positive = ("prompt_len", "hidden_size", "num_layers", "num_heads",
                    "intermediate_size", "prompts_per_step", "group_size", "minibatches",
                    "num_threads")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"options.{name}: must be >= 1, got {getattr(self, name)!r}")
        if self.group_size < 2:
            raise ConfigError(f"options.group_size: GRPO needs >= 2, got {self.group_size!r}")
        if self.vocab_size < DIGIT_BASE_ID + NUM_DIGITS:
            raise ConfigError(f"options.vocab_size: must be >= {DIGIT_BASE_ID + NUM_DIGITS}, "
                              f"got {self.vocab_size!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"options.num_heads: must divide hidden_size "
                              f"{self.hidden_size}, got {self.num_heads!r}")
        if self.prompts_per_step % self.minibatches:
            raise ConfigError(f"options.minibatches: must divide prompts_per_step "
                              f"{self.prompts_per_step}, got {self.minibatches!r}")
        if self.response_len_max != 0 and self.response_len_max <= self.prompt_len:
            raise ConfigError(f"options.response_len_max: must be 0 (fixed-length responses) "
                              f"or > prompt_len {self.prompt_len}, got "
                              f"{self.response_len_max!r}")
        for name in ("lr", "temperature", "max_grad_norm", "length_tail_alpha"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"options.{name}: must be > 0, got {getattr(self, name)!r}")

    @property
    def hyper(self) -> GrpoHyper:
        return GrpoHyper(clip_eps=self.clip_eps, kl_coef=self.kl_coef)


def build_policy(opts: GrpoToyOptions, seed: int) -> nn.Module:
    """A randomly initialised Llama, bit-identical for the same ``(opts, seed)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=opts.vocab_size, hidden_size=opts.hidden_size,
        intermediate_size=opts.intermediate_size, num_hidden_layers=opts.num_layers,
        num_attention_heads=opts.num_heads, num_key_value_heads=opts.num_heads,
        max_position_embeddings=(opts.prompt_len + opts.response_len_max + 8
                                 if opts.long_tail else 2 * opts.prompt_len + 8),
        bos_token_id=BOS_ID,
        eos_token_id=SEP_ID, pad_token_id=0, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # no dropout anywhere: train mode would change nothing, but keep it explicit
    model.eval()  # type: ignore[no-untyped-call]
    return model


def rollout_seed(seed: int, weights_version: int) -> int:
    """The sampling seed of one rollout: a function of (job seed, version) only."""
    return (seed * _SEED_MIX + weights_version) % (2**63 - 1)


class GrpoToyJob:
    """GRPO on a digit task with a plain ``torch.optim.Adam`` trainer (see module doc)."""

    def __init__(self) -> None:
        self._ctx: JobContext | None = None
        self._opts = GrpoToyOptions()
        self._task = DigitTask(TaskKind.COPY, 4)
        self._policy: nn.Module | None = None
        self._reference: nn.Module | None = None
        self._optim: torch.optim.Optimizer | None = None
        self._updates = 0
        self._borrowed = False  # parameters are bound to someone else's (shared) memory

    # -- setup ----------------------------------------------------------------------
    def setup(self, ctx: JobContext) -> None:
        import torch

        self._ctx = ctx
        self._opts = GrpoToyOptions.from_mapping(ctx.options)
        self._task = DigitTask(TaskKind.parse(self._opts.task), self._opts.prompt_len)
        torch.set_num_threads(self._opts.num_threads)
        self._policy = build_policy(self._opts, ctx.seed)
        if ctx.role is Role.TRAIN:
            self._reference = build_policy(self._opts, ctx.seed)
            self._reference.requires_grad_(False)
            self._make_trainer(self._policy)
        else:
            self._policy.requires_grad_(False)

    def _make_trainer(self, policy: nn.Module) -> None:
        """Create the optimizer (the DeepSpeed variant overrides this)."""
        import torch

        self._optim = torch.optim.Adam(policy.parameters(), lr=self._opts.lr)

    @property
    def options(self) -> GrpoToyOptions:
        return self._opts

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.policy.parameters())

    @property
    def policy(self) -> nn.Module:
        if self._policy is None:
            raise StateError("grpo-toy: setup() has not been called")
        return self._policy

    @property
    def context(self) -> JobContext:
        if self._ctx is None:
            raise StateError("grpo-toy: setup() has not been called")
        return self._ctx

    def _action_ids(self) -> Tensor:
        """Token id of each action: the ten digits, then (long tail) end-of-sequence."""
        import torch

        digits = torch.arange(DIGIT_BASE_ID, DIGIT_BASE_ID + NUM_DIGITS)
        if not self._opts.long_tail:
            return digits
        return torch.cat([digits, torch.tensor([SEP_ID])])

    def _prefix(self, prompts: Tensor) -> Tensor:
        import torch

        n = prompts.shape[0]
        bos = torch.full((n, 1), BOS_ID, dtype=torch.int64)
        sep = torch.full((n, 1), SEP_ID, dtype=torch.int64)
        return torch.cat([bos, prompts + DIGIT_BASE_ID, sep], dim=1)

    # -- rollout --------------------------------------------------------------------
    def generate(self, weights_version: int) -> Trajectories:
        import torch

        opts = self._opts
        gen = torch.Generator().manual_seed(rollout_seed(self.context.seed, weights_version))
        prompts = self._task.sample_prompts(opts.prompts_per_step, gen)
        prompts = prompts.repeat_interleave(opts.group_size, dim=0)
        if opts.long_tail:
            return self._generate_long_tail(prompts, gen, weights_version)
        responses = self.sample(prompts, gen)
        rewards = self._task.reward(prompts, responses)
        metrics = {"reward_mean": float(rewards.mean()),
                   "reward_max": float(rewards.max())}
        return Trajectories({"prompts": prompts, "responses": responses,
                             "rewards": rewards}, metrics)

    def sample(self, prompts: Tensor, generator: torch.Generator) -> Tensor:
        """Sample response digits token by token (full recompute; sequences are short)."""
        import torch

        action_ids = self._action_ids()
        tokens = self._prefix(prompts)
        actions = []
        with torch.inference_mode():
            for _ in range(self._task.response_len):
                logits = self.policy(input_ids=tokens, use_cache=False).logits[:, -1, :]
                probs = torch.softmax(logits.index_select(-1, action_ids).float()
                                      / self._opts.temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
                actions.append(nxt)
                tokens = torch.cat([tokens, nxt + DIGIT_BASE_ID], dim=1)
        return torch.cat(actions, dim=1)

    def _generate_long_tail(self, prompts: Tensor, gen: torch.Generator,
                            weights_version: int) -> Trajectories:
        import torch

        opts = self._opts
        caps = length_caps(self.context.seed, weights_version, prompts.shape[0],
                           opts.prompt_len + 1, opts.response_len_max, opts.length_tail_alpha)
        responses, lengths = self.sample_until_end(prompts, caps, gen)
        rewards = self._task.reward_ended(prompts, responses, lengths)
        lens = lengths.to(torch.float32)
        metrics = {"reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()),
                   "response_len_mean": float(lens.mean()),
                   "response_len_max": float(lens.max())}
        return Trajectories({"prompts": prompts, "responses": responses, "lengths": lengths,
                             "rewards": rewards}, metrics)

    def sample_until_end(self, prompts: Tensor, caps: Tensor,
                         generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Decode until each row ends (EOS action or its cap); finished rows leave the batch.

        Returns the actions ``[n, max length]`` (0 past a row's end) and the lengths
        ``[n]`` (the EOS action counted). Reports the rows still decoding after each token.
        """
        import torch

        action_ids = self._action_ids()
        n = prompts.shape[0]
        out = torch.zeros((n, int(caps.max())), dtype=torch.int64)
        lengths = torch.zeros(n, dtype=torch.int64)
        tokens, live = self._prefix(prompts), torch.arange(n)
        t = 0
        report_progress(n, n)
        with torch.inference_mode():
            while live.numel():
                logits = self.policy(input_ids=tokens, use_cache=False).logits[:, -1, :]
                probs = torch.softmax(logits.index_select(-1, action_ids).float()
                                      / self._opts.temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
                out[live, t] = nxt[:, 0]
                t += 1
                done = (nxt[:, 0] == EOS_ACTION) | (caps[live] <= t)
                lengths[live[done]] = t
                keep = ~done
                live = live[keep]
                tokens = torch.cat([tokens, action_ids[nxt]], dim=1)[keep]
                report_progress(int(live.numel()), n)
        return out[:, :int(lengths.max())], lengths

    # -- train ----------------------------------------------------------------------
    def update(self, trajectories: Trajectories) -> Mapping[str, float]:
        import torch

        reference = self._reference
        if reference is None:
            raise StateError(f"grpo-toy job {self.context.job_id}: update() on a "
                             f"{self.context.role.value} instance (needs role train)")
        opts = self._opts
        t = trajectories.tensors
        prompts, responses, rewards = t["prompts"], t["responses"], t["rewards"]
        action_ids = self._action_ids()
        mask: Tensor | None = None
        if "lengths" in t:   # variable-length responses: the loss covers valid tokens only
            tokens = torch.cat([self._prefix(prompts), action_ids[responses]], dim=1)
            mask = (torch.arange(responses.shape[1]).unsqueeze(0)
                    < t["lengths"].unsqueeze(1)).to(torch.float32)
        else:
            tokens = torch.cat([self._prefix(prompts), responses + DIGIT_BASE_ID], dim=1)
        adv = group_advantages(rewards, opts.group_size, opts.hyper.adv_eps)
        with torch.no_grad():
            old_logp = action_logprobs(self.policy, tokens, responses, action_ids)
            ref_logp = action_logprobs(reference, tokens, responses, action_ids)
        per_mb = tokens.shape[0] // opts.minibatches
        sums: dict[str, float] = {}
        for i in range(opts.minibatches):
            sl = self._rows(i * per_mb, (i + 1) * per_mb)
            logp = action_logprobs(self._train_model(), tokens[sl], responses[sl], action_ids)
            loss, metrics = grpo_loss(logp, old_logp[sl], ref_logp[sl], adv[sl], opts.hyper,
                                      None if mask is None else mask[sl])
            self._step(loss)
            metrics["loss"] = float(loss.detach())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v / opts.minibatches
        self._updates += 1
        sums["reward_mean"] = float(rewards.mean())
        return sums

    def _rows(self, start: int, stop: int) -> slice:
        """The rows of a minibatch this instance trains on (data-parallel ranks: a share)."""
        return slice(start, stop)

    def _train_model(self) -> nn.Module:
        """The module the training forward goes through (DeepSpeed: its engine)."""
        return self.policy

    def _step(self, loss: Tensor) -> None:
        """Backward, clip, optimizer step (the DeepSpeed variant overrides this)."""
        import torch

        if self._optim is None:
            raise StateError("grpo-toy: no optimizer (role is not train)")
        self._optim.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self._opts.max_grad_norm)
        self._optim.step()

    # -- weights and warm state ------------------------------------------------------
    def export_weights(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        self._install(tensors, "weights")

    def _install(self, tensors: Mapping[str, Tensor], what: str) -> None:
        """Copy ``tensors`` into the policy; after a borrow, into fresh private memory
        (copying into borrowed parameters would write the shared segment)."""
        if self._borrowed:
            _load_module(self.policy, {k: v.clone() for k, v in tensors.items()}, what,
                         assign=True)
            self._borrowed = False
        else:
            _load_module(self.policy, tensors, what)

    def borrow_weights(self, tensors: Mapping[str, Tensor]) -> None:
        """Bind the policy's parameters to ``tensors`` (no copy): rollout role only,
        which never writes its weights (see :class:`~weave_slurm.workloads.api.BorrowsWeights`)."""
        if self.context.role is not Role.ROLLOUT:
            raise StateError(f"grpo-toy job {self.context.job_id}: borrow_weights() needs role "
                             f"rollout, not {self.context.role.value} (training writes its "
                             "weights)")
        _load_module(self.policy, tensors, "borrowed weights", assign=True)
        self._borrowed = True

    def state_tensors(self) -> dict[str, Tensor]:
        import torch

        state = {f"policy.{k}": v for k, v in self.export_weights().items()}
        if self._reference is not None:
            for k, v in self._reference.state_dict().items():
                state[f"reference.{k}"] = v.detach().clone()
        state.update(self._optimizer_state())
        state["rng.seed"] = torch.tensor(self.context.seed, dtype=torch.int64)
        state["data.position"] = torch.tensor(self._updates, dtype=torch.int64)
        return state

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        seed = int(tensors["rng.seed"].item()) if "rng.seed" in tensors else None
        if seed != self.context.seed:
            raise StateError(f"grpo-toy job {self.context.job_id}: warm state has seed "
                             f"{seed!r}, this instance {self.context.seed}")
        self._install(_sub(tensors, "policy."), "state policy")
        if self._reference is not None:
            _load_module(self._reference, _sub(tensors, "reference."), "state reference")
            self._load_optimizer_state(_sub(tensors, "optim."))
        self._updates = int(tensors["data.position"].item())

    def _param_names(self) -> list[str]:
        return [name for name, _ in self.policy.named_parameters()]

    def _optimizer_state(self) -> dict[str, Tensor]:
        """Adam state as ``optim.<param>.<field>`` tensors (empty before the first step)."""
        if self._optim is None:
            return {}
        names = self._param_names()
        out: dict[str, Tensor] = {}
        for idx, st in self._optim.state_dict()["state"].items():
            for field_name, value in st.items():
                out[f"optim.{names[idx]}.{field_name}"] = value.detach().clone()
        return out

    def _load_optimizer_state(self, tensors: Mapping[str, Tensor]) -> None:
        if self._optim is None:
            return
        sd = self._optim.state_dict()
        state: dict[int, dict[str, Tensor]] = {}
        for idx, name in enumerate(self._param_names()):
            prefix = f"{name}."
            fields_ = {k[len(prefix):]: v.clone() for k, v in tensors.items()
                       if k.startswith(prefix) and "." not in k[len(prefix):]}
            if fields_:
                state[idx] = fields_
        sd["state"] = state
        self._optim.load_state_dict(sd)


def _sub(tensors: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _load_module(module: nn.Module, tensors: Mapping[str, Tensor], what: str, *,
                 assign: bool = False) -> None:
    import torch

    expected = set(module.state_dict())
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected)
    if missing or extra:
        raise StateError(f"grpo-toy {what}: keys do not match the model "
                         f"(missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        if assign:   # same dtypes and shapes, or the model would silently change
            for name, t in module.state_dict().items():
                got = tensors[name]
                if got.dtype != t.dtype or got.shape != t.shape:
                    raise StateError(f"grpo-toy {what}: {name} is {got.dtype}"
                                     f"{list(got.shape)}, the model has {t.dtype}"
                                     f"{list(t.shape)}")
        module.load_state_dict(dict(tensors), strict=True, assign=assign)
