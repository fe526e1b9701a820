"""Options of the reference job (``builtin:grpo-toy``) and the token ids it works on.

``sampling`` selects how a rollout draws its responses:

- ``"batch"`` (the default): one random stream per rollout, seeded by
  ``(seed, version)``, drawn across the whole batch token by token;
- ``"per_prompt"``: prompt ``i`` of the rollout at version ``v`` draws its responses
  from a stream of its own, seeded by ``(seed, v, i)``. A batch is then the same
  however its prompts are split over engines (a rollout gang: docs/job_api.md,
  "Gangs"), so a rollout over several engines needs it. The two modes sample
  different (equally valid) batches for the same seed.

``reshard``: a training gang may load a full, single-rank warm state (each rank keeps
its rows); a state sharded over another number of ranks is merged first
(:func:`~weave_slurm.workloads.grpo_fsdp.merge_state_shards`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import member_of
from weave_slurm.workloads.grpo import GrpoHyper
from weave_slurm.workloads.tasks import NUM_DIGITS, TaskKind

BOS_ID = 1
SEP_ID = 2
DIGIT_BASE_ID = 16  # token id of digit 0; digits are DIGIT_BASE_ID .. DIGIT_BASE_ID + 9


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
    sampling: str = "batch"            # "per_prompt": draws per prompt (engines may split)
    reshard: bool = False              # a training gang may load a full (1-rank) state

    @property
    def long_tail(self) -> bool:
        return self.response_len_max > 0

    @property
    def per_prompt(self) -> bool:
        return Sampling.parse(self.sampling) is Sampling.PER_PROMPT

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
        Sampling.parse(self.sampling)
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


class Sampling(enum.Enum):
    """How a rollout draws its responses (module doc)."""

    BATCH = "batch"
    PER_PROMPT = "per_prompt"

    @classmethod
    def parse(cls, value: str) -> Sampling:
        return member_of(cls, value, "options.sampling: unknown value {value} "
                                     "(valid: {choices})")
