"""Cost rates of nodes and groups (pure): one price per node-hour per pool.

The one home of a price: placement prices a candidate with :meth:`CostRates.rate`, the
simulator's accounting integrates node-seconds per pool with :meth:`CostRates.price`
and :meth:`CostRates.per_hour`. Pools are :class:`~weave_slurm.vocab.Pool` members
(a ``StrEnum``, so ``"rollout"`` and ``"train"`` key the same prices).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from weave_slurm.config.site import SiteConfig
from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Pool


@dataclass(frozen=True, slots=True)
class CostRates:
    """Price per node-hour of each pool (the site's currency, or any unit)."""

    rollout_node_hour: float
    train_node_hour: float

    def __post_init__(self) -> None:
        for pool, price in ((Pool.ROLLOUT, self.rollout_node_hour),
                            (Pool.TRAIN, self.train_node_hour)):
            if (isinstance(price, bool) or not isinstance(price, int | float)
                    or not math.isfinite(price) or price < 0):
                raise ConfigError(f"cost rate for pool {pool.value!r}: {price!r}; expected a "
                                  f"finite price >= 0 per node-hour")

    @classmethod
    def from_site(cls, site: SiteConfig) -> CostRates:
        return cls(site.rollout.price_per_node_hour, site.train.price_per_node_hour)

    def price(self, pool: Pool | str) -> float:
        """Price of one node of ``pool`` for one hour."""
        role = Pool.parse(pool, "cost rate for pool")
        return self.rollout_node_hour if role is Pool.ROLLOUT else self.train_node_hour

    def rate(self, rollout_nodes: float, train_nodes: float) -> float:
        """Cost per hour of holding this many nodes of each pool."""
        return rollout_nodes * self.rollout_node_hour + train_nodes * self.train_node_hour

    def per_hour(self, nodes: Mapping[Pool, float]) -> float:
        """Cost per hour of holding ``nodes`` (pool -> count)."""
        return sum(self.price(pool) * count for pool, count in nodes.items() if count)
