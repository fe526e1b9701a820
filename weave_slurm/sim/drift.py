"""Phase times that drift during a job's life (the paper's drift experiment).

RL jobs change speed as they train: response lengths grow (or shrink) with the policy,
so rollout time moves, and training time follows the token count more weakly. A
:class:`DriftModel` gives each job a few change points over its life; at each, the
job's actual rollout time is its profiled time times a factor, and its training time
moves by half as much. ``increasing`` ends at ``1 + amplitude``, ``decreasing`` at
``1 - amplitude / 2``, ``mixed`` gives each job one of the two at random (seeded).
Placement keeps planning with what it was told at admission unless it re-plans.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import member_of


class DriftPattern(enum.StrEnum):
    INCREASING = "increasing"
    DECREASING = "decreasing"
    MIXED = "mixed"

    @classmethod
    def parse(cls, value: str) -> DriftPattern:
        return member_of(cls, value, "--drift {value}: valid choices: {choices}")


@dataclass(frozen=True, slots=True)
class DriftPoint:
    at_fraction: float  # of the job's (trace) lifetime
    rollout_factor: float
    train_factor: float


@dataclass(frozen=True, slots=True)
class DriftModel:
    pattern: DriftPattern
    amplitude: float = 0.5
    steps: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.amplitude < 2 or self.steps < 1:
            raise ConfigError(f"drift amplitude {self.amplitude!r} must be in (0, 2) and steps "
                              f"{self.steps!r} >= 1")

    def points(self, job_id: str) -> tuple[DriftPoint, ...]:
        """Change points of one job (deterministic for a seed and job id)."""
        pattern = self.pattern
        if pattern is DriftPattern.MIXED:
            rng = random.Random(f"weave-drift:{self.seed}:{job_id}")
            pattern = rng.choice((DriftPattern.INCREASING, DriftPattern.DECREASING))
        end = 1 + self.amplitude if pattern is DriftPattern.INCREASING else 1 - self.amplitude / 2
        out = []
        for k in range(1, self.steps + 1):
            rollout = 1 + (end - 1) * k / self.steps
            out.append(DriftPoint(k / (self.steps + 1), rollout, 1 + (rollout - 1) / 2))
        return tuple(out)
