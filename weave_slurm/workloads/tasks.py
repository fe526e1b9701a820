"""Verifiable toy tasks on digit tokens for the reference GRPO job.

A task draws prompts (digit values 0..9) from a seeded generator and scores responses
with a per-position partial credit in [0, 1], so that a random policy already earns
some reward (about 0.1) and GRPO has a dense signal. Responses have a fixed length,
except in the long-tailed variant (:func:`length_caps`, :meth:`DigitTask.reward_ended`):
a response ends at an end-of-sequence action or at a per-request length cap drawn from
a heavy-tailed (Pareto) distribution, so a batch's last requests decode long after the
bulk has finished, as an LLM rollout's do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import member_of

if TYPE_CHECKING:
    import torch

#: Number of distinct digit values; the policy's action space.
NUM_DIGITS = 10
#: The end-of-sequence action of the long-tailed variant (the action after the digits).
EOS_ACTION = NUM_DIGITS
_CAP_MIX = 2_654_435_761


class TaskKind(enum.Enum):
    """The toy tasks; the response has the prompt's length."""

    COPY = "copy"  # repeat the prompt digits
    REVERSE = "reverse"  # the prompt digits in reverse order
    INCREMENT = "increment"  # each prompt digit plus one, modulo 10

    @classmethod
    def parse(cls, value: str, key: str = "task") -> TaskKind:
        return member_of(cls, value, key + ": unknown task {value} (valid: {choices})")


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

    def reward_ended(self, prompts: torch.Tensor, responses: torch.Tensor,
                     lengths: torch.Tensor) -> torch.Tensor:
        """Reward of variable-length responses (long-tailed variant), shape ``[n]``.

        ``responses`` is ``[n, L]`` actions (digits, :data:`EOS_ACTION`), valid up to
        ``lengths``. Credit: one point per target digit in place among the first
        ``prompt_len`` actions, one more for ending (EOS) right after them, divided by
        ``prompt_len + 1``; digits past the target earn nothing.
        """
        import torch

        width = responses.shape[1]
        k = self.prompt_len
        pad = max(0, k + 1 - width)
        resp = torch.nn.functional.pad(responses, (0, pad), value=-1)
        pos = torch.arange(resp.shape[1]).unsqueeze(0)
        valid = pos < lengths.unsqueeze(1)
        hits = ((resp[:, :k] == self.targets(prompts)) & valid[:, :k]).sum(dim=1)
        ended = (lengths == k + 1) & (resp[:, k] == EOS_ACTION)
        return (hits + ended.to(hits.dtype)).to(torch.float32) / float(k + 1)


def length_caps(seed: int, step: int, n: int, base_len: int, max_len: int,
                alpha: float) -> torch.Tensor:
    """Per-request response length caps, ``[n]`` int64, heavy-tailed and deterministic.

    Request ``i`` of rollout ``step`` draws ``u`` from a generator seeded by
    ``(seed, step, i)`` only (not by the batch or the process), and gets the Pareto
    cap ``ceil(base_len * u ** (-1 / alpha))`` clipped to ``max_len``: most requests
    are short, a few run to ``max_len`` (``alpha`` near 1: a heavy tail).
    """
    import math

    import torch

    caps = []
    for i in range(n):
        mix = ((seed * _CAP_MIX + step) * _CAP_MIX + i) % (2**63 - 1)
        u = float(torch.rand(1, generator=torch.Generator().manual_seed(mix)))
        u = max(u, 1e-12)
        caps.append(min(max_len, max(1, math.ceil(base_len * u ** (-1.0 / alpha)))))
    return torch.tensor(caps, dtype=torch.int64)
