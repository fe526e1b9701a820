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

Gangs (docs/job_api.md): a rollout over ``E`` engines (role rollout, ``world_size``
``E``, ``sampling = "per_prompt"``) has engine ``r`` generate its share of the prompts
(:meth:`~weave_slurm.workloads.api.JobContext.share`), and :meth:`GrpoToyJob.merge_trajectories`
joins the shares in rank order into the single-engine batch. A training gang
(``world_size > 1``) trains through :class:`~weave_slurm.workloads.grpo_fsdp.FsdpTrainer`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Role, Trajectories, report_progress
from weave_slurm.workloads.gang_api import WeightShard, whole_shard
from weave_slurm.workloads.grpo import action_logprobs, group_advantages, grpo_loss
from weave_slurm.workloads.grpo_fsdp import FsdpTrainer, gang_refusal, shard_world
from weave_slurm.workloads.grpo_model import build_policy, load_module, sub_tensors
from weave_slurm.workloads.grpo_options import (
    BOS_ID,
    DIGIT_BASE_ID,
    SEP_ID,
    GrpoToyOptions,
)
from weave_slurm.workloads.tasks import (
    EOS_ACTION,
    NUM_DIGITS,
    DigitTask,
    TaskKind,
    length_caps,
)
from weave_slurm.workloads.trajectories import concat_trajectories

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    #: what draws one action per row: one stream, or one stream per prompt
    Draws = torch.Generator | Sequence[torch.Generator]

__all__ = ["BOS_ID", "DIGIT_BASE_ID", "NUM_DIGITS", "SEP_ID", "GrpoToyJob", "GrpoToyOptions",
           "build_policy", "prompt_seed", "rollout_seed"]

log = logging.getLogger(__name__)

_SEED_MIX = 1_000_003


def rollout_seed(seed: int, weights_version: int) -> int:
    """The sampling seed of one rollout: a function of (job seed, version) only."""
    return (seed * _SEED_MIX + weights_version) % (2**63 - 1)


def prompt_seed(seed: int, weights_version: int, prompt: int) -> int:
    """The sampling seed of prompt ``prompt`` of a rollout (``sampling = "per_prompt"``)."""
    return ((rollout_seed(seed, weights_version) * _SEED_MIX + prompt + 1) * _SEED_MIX
            % (2**63 - 1))


def _draw(probs: Tensor, prompt_of_row: Tensor | None, draws: Draws) -> Tensor:
    """One action per row ``[n, 1]``: from one stream, or row ``i`` from the stream of
    its prompt ``prompt_of_row[i]`` (rows of a prompt are contiguous)."""
    import torch

    if isinstance(draws, torch.Generator):
        return torch.multinomial(probs, 1, generator=draws)
    assert prompt_of_row is not None  # per-prompt streams come with the rows' prompts
    out = torch.empty((probs.shape[0], 1), dtype=torch.int64)
    for prompt in torch.unique_consecutive(prompt_of_row).tolist():
        rows = prompt_of_row == prompt
        out[rows] = torch.multinomial(probs[rows], 1, generator=draws[prompt])
    return out


class GrpoToyJob:
    """GRPO on a digit task with a plain ``torch.optim.Adam`` trainer (see module doc)."""

    def __init__(self) -> None:
        self._ctx: JobContext | None = None
        self._opts = GrpoToyOptions()
        self._task = DigitTask(TaskKind.COPY, 4)
        self._policy: nn.Module | None = None
        self._reference: nn.Module | None = None
        self._optim: torch.optim.Optimizer | None = None
        self._gang: FsdpTrainer | None = None  # a training gang's trainer (world_size > 1)
        self._updates = 0
        self._borrowed = False  # parameters are bound to someone else's (shared) memory

    # -- setup ----------------------------------------------------------------------
    def setup(self, ctx: JobContext) -> None:
        import torch

        self._ctx = ctx
        self._opts = GrpoToyOptions.from_mapping(ctx.options)
        if ctx.role is Role.ROLLOUT and ctx.world_size > 1 and not self._splits_prompts():
            raise ConfigError(f"options.sampling: a rollout over {ctx.world_size} engines "
                              "needs 'per_prompt' (a 'batch' stream depends on how the "
                              f"prompts are split), got {self._opts.sampling!r}")
        self._task = DigitTask(TaskKind.parse(self._opts.task), self._opts.prompt_len)
        torch.set_num_threads(self._opts.num_threads)
        self._policy = build_policy(self._opts, ctx.seed)
        if ctx.role is Role.TRAIN:
            self._reference = build_policy(self._opts, ctx.seed)
            self._reference.requires_grad_(False)
            self._make_trainer(self._policy)
        else:
            self._policy.requires_grad_(False)

    def _splits_prompts(self) -> bool:
        """Whether a rollout's prompts may be split over engines (the batch unchanged)."""
        return self._opts.per_prompt

    def _make_trainer(self, policy: nn.Module) -> None:
        """Create the optimizer, or a gang's FSDP2 trainer (the DeepSpeed variant
        overrides this)."""
        import torch

        if self.context.world_size > 1:
            assert self._reference is not None  # built before the trainer
            self._gang = FsdpTrainer(self.context, self._opts, policy, self._reference)
            return
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
        """A rollout; an engine of a rollout gang generates its share of the prompts."""
        import torch

        opts = self._opts
        gen = torch.Generator().manual_seed(rollout_seed(self.context.seed, weights_version))
        prompts = self._task.sample_prompts(opts.prompts_per_step, gen)
        draws: Draws = gen
        first = 0
        if opts.per_prompt:
            first, last = (self.context.share(len(prompts)) if self.context.role is Role.ROLLOUT
                           else (0, len(prompts)))
            prompts = prompts[first:last]
            draws = [torch.Generator().manual_seed(prompt_seed(self.context.seed,
                                                               weights_version, i))
                     for i in range(first, last)]
        prompts = prompts.repeat_interleave(opts.group_size, dim=0)
        if opts.long_tail:
            return self._generate_long_tail(prompts, draws, weights_version,
                                            first * opts.group_size)
        responses = self.sample(prompts, draws)
        tensors = {"prompts": prompts, "responses": responses,
                   "rewards": self._task.reward(prompts, responses)}
        return Trajectories(tensors, _rollout_metrics(tensors))

    def merge_trajectories(self, parts: Sequence[Trajectories]) -> Trajectories:
        """The engines' shares (rank order) as the batch one engine would have made."""
        merged = concat_trajectories(parts)
        return Trajectories(merged.tensors, _rollout_metrics(merged.tensors))

    def _no_grad(self) -> contextlib.AbstractContextManager[object]:
        """Inference mode; plain no-grad for a gang's sharded policy (FSDP2 reuses its
        gather buffers in training, which inference tensors would forbid)."""
        import torch

        return torch.no_grad() if self._gang is not None else torch.inference_mode()

    def _prompt_of_row(self, rows: Tensor) -> Tensor | None:
        return rows // self._opts.group_size if self._opts.per_prompt else None

    def sample(self, prompts: Tensor, draws: Draws) -> Tensor:
        """Sample response digits token by token (full recompute; sequences are short)."""
        import torch

        if prompts.shape[0] == 0:   # an engine of a pool wider than the prompts: no share
            return torch.zeros((0, self._task.response_len), dtype=torch.int64)
        action_ids = self._action_ids()
        tokens = self._prefix(prompts)
        prompt_of_row = self._prompt_of_row(torch.arange(prompts.shape[0]))
        actions = []
        with self._no_grad():
            for _ in range(self._task.response_len):
                logits = self.policy(input_ids=tokens, use_cache=False).logits[:, -1, :]
                probs = torch.softmax(logits.index_select(-1, action_ids).float()
                                      / self._opts.temperature, dim=-1)
                nxt = _draw(probs, prompt_of_row, draws)
                actions.append(nxt)
                tokens = torch.cat([tokens, nxt + DIGIT_BASE_ID], dim=1)
        return torch.cat(actions, dim=1)

    def _generate_long_tail(self, prompts: Tensor, draws: Draws, weights_version: int,
                            first_row: int) -> Trajectories:
        opts = self._opts
        n = prompts.shape[0]
        total = opts.prompts_per_step * opts.group_size if opts.per_prompt else n
        caps = length_caps(self.context.seed, weights_version, total, opts.prompt_len + 1,
                           opts.response_len_max, opts.length_tail_alpha)
        responses, lengths = self.sample_until_end(prompts, caps[first_row:first_row + n],
                                                   draws)
        tensors = {"prompts": prompts, "responses": responses, "lengths": lengths,
                   "rewards": self._task.reward_ended(prompts, responses, lengths)}
        return Trajectories(tensors, _rollout_metrics(tensors))

    def sample_until_end(self, prompts: Tensor, caps: Tensor,
                         draws: Draws) -> tuple[Tensor, Tensor]:
        """Decode until each row ends (EOS action or its cap); finished rows leave the batch.

        Returns the actions ``[n, max length]`` (0 past a row's end) and the lengths
        ``[n]`` (the EOS action counted). Reports the rows still decoding after each token.
        """
        import torch

        action_ids = self._action_ids()
        n = prompts.shape[0]
        if n == 0:   # an engine with no share of the prompts
            return torch.zeros((0, 0), dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
        out = torch.zeros((n, int(caps.max())), dtype=torch.int64)
        lengths = torch.zeros(n, dtype=torch.int64)
        tokens, live = self._prefix(prompts), torch.arange(n)
        t = 0
        report_progress(n, n)
        with self._no_grad():
            while live.numel():
                logits = self.policy(input_ids=tokens, use_cache=False).logits[:, -1, :]
                probs = torch.softmax(logits.index_select(-1, action_ids).float()
                                      / self._opts.temperature, dim=-1)
                nxt = _draw(probs, self._prompt_of_row(live), draws)
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
        if self._gang is not None:
            sums = self._gang.train_batch(tokens, responses, adv, mask, action_ids)
        else:
            sums = self._train_batch(reference, tokens, responses, adv, mask, action_ids)
        self._updates += 1
        sums["reward_mean"] = float(rewards.mean())
        return sums

    def _train_batch(self, reference: nn.Module, tokens: Tensor, responses: Tensor,
                     adv: Tensor, mask: Tensor | None, action_ids: Tensor) -> dict[str, float]:
        """The minibatch steps of one rank (a DeepSpeed rank: its rows, ``_rows``)."""
        import torch

        opts = self._opts
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
        """The policy weights; a training gang's are gathered on rank 0 (``{}`` on the
        other ranks: a collective every rank calls)."""
        if self._gang is not None:
            return self._gang.export_full()
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def export_weight_shard(self) -> WeightShard:
        """This rank's shard of the policy weights (a single rank: all of them)."""
        if self._gang is not None:
            return self._gang.export_shard()
        return whole_shard(self.export_weights())

    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        self._install(tensors, "weights")

    def _install(self, tensors: Mapping[str, Tensor], what: str) -> None:
        """Copy ``tensors`` into the policy; after a borrow, into fresh private memory
        (copying into borrowed parameters would write the shared segment)."""
        if self._borrowed:
            load_module(self.policy, {k: v.clone() for k, v in tensors.items()}, what,
                        assign=True)
            self._borrowed = False
        else:
            load_module(self.policy, tensors, what)

    def borrow_weights(self, tensors: Mapping[str, Tensor]) -> None:
        """Bind the policy's parameters to ``tensors`` (no copy): rollout role only,
        which never writes its weights (see :class:`~weave_slurm.workloads.api.BorrowsWeights`)."""
        if self.context.role is not Role.ROLLOUT:
            raise StateError(f"grpo-toy job {self.context.job_id}: borrow_weights() needs role "
                             f"rollout, not {self.context.role.value} (training writes its "
                             "weights)")
        load_module(self.policy, tensors, "borrowed weights", assign=True)
        self._borrowed = True

    def device_tensors(self) -> dict[str, Tensor]:
        """What a warm switch moves off the device (``SwitchesDevice``): the policy (not
        while it is bound to borrowed shared memory), the reference and Adam's moments.
        A training gang's FSDP2 shards are not named (they stay where they are)."""
        from weave_slurm.device.switch import module_tensors, optimizer_tensors

        if self._gang is not None:
            return {}
        out = {} if self._borrowed else module_tensors(self.policy, "policy")
        if self._reference is not None:
            out.update(module_tensors(self._reference, "reference"))
        if self._optim is not None:
            out.update(optimizer_tensors(self._optim, "optim"))
        return out

    def state_tensors(self) -> dict[str, Tensor]:
        """The warm state; a training gang rank's holds its shards (``gang.*`` says which)."""
        import torch

        if self._gang is not None:
            state = self._gang.state_tensors()
        else:
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
        if self._gang is not None:
            self._gang.load_state(tensors)
            self._updates = int(tensors["data.position"].item())
            return
        if shard_world(tensors) != 1:
            raise StateError(gang_refusal(self.context.job_id, shard_world(tensors),
                                          self.context.rank, 1))
        self._install(sub_tensors(tensors, "policy."), "state policy")
        if self._reference is not None:
            load_module(self._reference, sub_tensors(tensors, "reference."), "state reference")
            self._load_optimizer_state(sub_tensors(tensors, "optim."))
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


def _rollout_metrics(tensors: Mapping[str, Tensor]) -> dict[str, float]:
    """A rollout's metrics, from its tensors (so merged shares get the batch's)."""
    import torch

    rewards = tensors["rewards"]
    if rewards.numel() == 0:   # an engine with no share of the prompts: nothing to say
        return {}
    metrics = {"reward_mean": float(rewards.mean()), "reward_max": float(rewards.max())}
    if "lengths" in tensors:
        lens = tensors["lengths"].to(torch.float32)
        metrics.update(response_len_mean=float(lens.mean()),
                       response_len_max=float(lens.max()))
    return metrics
