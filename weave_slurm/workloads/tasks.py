"""Verifiable toy tasks on digit tokens for the reference GRPO job.

A task draws prompts (digit values 0..9) from a seeded generator and scores responses
with a per-position partial credit in [0, 1], so that a random policy already earns
some reward (about 0.1) and GRPO has a dense signal. Responses have a fixed length.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weave_slurm.errors import ConfigError

if TYPE_CHECKING:
    import torch

#: Number of distinct digit values; the policy's action space.
NUM_DIGITS = 10


class TaskKind(enum.Enum):
    """The toy tasks; the response has the prompt's length."""

    COPY = "copy"  # repeat the prompt digits
    REVERSE = "reverse"  # the prompt digits in reverse order
    INCREMENT = "increment"  # each prompt digit plus one, modulo 10

    @classmethod
    def parse(cls, value: str, key: str = "task") -> TaskKind:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(k.value for k in cls)
            raise ConfigError(f"{key}: unknown task {value!r} (valid: {choices})") from None


@dataclass(frozen=True)
class DigitTask:
    """A task instance: which mapping, and how many digits per prompt."""

    kind: TaskKind
    prompt_len: int

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_len <= 64:
            raise ConfigError(f"prompt_len: must be in 1..64, got {self.prompt_len!r}")

    @property
    def response_len(self) -> int:
        return self.prompt_len

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` prompts of digit values, shape ``[n, prompt_len]`` (int64)."""
        import torch

        return torch.randint(0, NUM_DIGITS, (n, self.prompt_len), generator=generator)

    def targets(self, prompts: torch.Tensor) -> torch.Tensor:
        """The correct response digits for each prompt, shape ``[n, response_len]``."""
        if self.kind is TaskKind.COPY:
            return prompts.clone()
        if self.kind is TaskKind.REVERSE:
            return prompts.flip(-1)
        return (prompts + 1) % NUM_DIGITS

    def reward(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Fraction of response positions equal to the target, shape ``[n]`` (float32)."""
        import torch

        if responses.shape != prompts.shape:
            raise ValueError(f"responses shape {tuple(responses.shape)} != "
                             f"prompts shape {tuple(prompts.shape)}")
        hits = responses == self.targets(prompts)
        return hits.to(torch.float32).mean(dim=-1)
