"""SLO distributions for jobs whose trace gives none.

A job's SLO is its permitted slowdown: 1.5 means its mean iteration time may be at most
1.5x its solo iteration time. Spec strings: ``uniform:LOW,HIGH`` or ``fixed:VALUE``.

Draws use :class:`random.Random` seeded once per trace and are taken in the trace's
arrival order, one ``uniform`` draw per job, so that ``uniform:1.1,2`` with seed 2345
yields the same SLO sequence as the reference replay of ``wild.trace`` (which calls
``random.uniform(1.1, 2)`` per arrival after ``random.seed(2345)``).
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

from weave_slurm.errors import ConfigError

REFERENCE_SLO_SPEC = "uniform:1.1,2"
REFERENCE_SLO_SEED = 2345


class SloShape(enum.Enum):
    UNIFORM = "uniform"
    FIXED = "fixed"


@dataclass(frozen=True, slots=True)
class SloDistribution:
    """A distribution of SLOs (slowdown factors, each >= 1)."""

    shape: SloShape
    low: float
    high: float

    @classmethod
    def parse(cls, spec: str, *, flag: str = "--slo") -> SloDistribution:
        """Parse ``uniform:LOW,HIGH`` or ``fixed:VALUE``."""
        name, sep, rest = spec.partition(":")
        shapes = ", ".join(f"{s.value}:..." for s in SloShape)
        try:
            shape = SloShape(name.strip())
        except ValueError:
            raise ConfigError(f"{flag}: unknown SLO distribution {spec!r}; "
                              f"valid: uniform:LOW,HIGH, fixed:VALUE") from None
        if not sep:
            raise ConfigError(f"{flag}: {spec!r} lacks parameters; valid: {shapes}")
        try:
            values = [float(v) for v in rest.split(",")]
        except ValueError:
            raise ConfigError(f"{flag}: {spec!r} has a non-numeric parameter; "
                              f"expected uniform:LOW,HIGH or fixed:VALUE") from None
        want = 2 if shape is SloShape.UNIFORM else 1
        if len(values) != want:
            raise ConfigError(f"{flag}: {spec!r} needs {want} number(s); "
                              f"expected uniform:LOW,HIGH or fixed:VALUE")
        low, high = (values[0], values[-1])
        return cls.of(shape, low, high, flag=flag)

    @classmethod
    def of(cls, shape: SloShape, low: float, high: float, *, flag: str = "--slo"
           ) -> SloDistribution:
        if not (math.isfinite(low) and math.isfinite(high)) or low < 1.0 or high < low:
            raise ConfigError(f"{flag}: SLO bounds {low!r},{high!r} invalid; "
                              f"need 1 <= LOW <= HIGH (finite)")
        return cls(shape, low, high)

    @classmethod
    def fixed(cls, value: float) -> SloDistribution:
        return cls.of(SloShape.FIXED, value, value)

    @classmethod
    def uniform(cls, low: float, high: float) -> SloDistribution:
        return cls.of(SloShape.UNIFORM, low, high)

    def draw(self, rng: random.Random) -> float:
        """One SLO; a ``fixed`` distribution consumes no randomness."""
        if self.shape is SloShape.FIXED:
            return self.low
        return rng.uniform(self.low, self.high)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2.0

    def __str__(self) -> str:
        if self.shape is SloShape.FIXED:
            return f"fixed:{self.low:g}"
        return f"uniform:{self.low:g},{self.high:g}"


def reference_slo_distribution() -> SloDistribution:
    """The paper's SLO draw for ``wild.trace``: uniform in [1.1, 2]."""
    return SloDistribution.parse(REFERENCE_SLO_SPEC)
