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


#: Restarting a moved member's workers on their new nodes (attach the copied warm state,
#: rendezvous, first collective): a few warm switches (0.9-5.9 s each, Weave OSDI 2026)
#: plus process start; a site measures its own and sets it in ReplayOptions / MoveCost.
DEFAULT_MOVE_RESTART_S = 30.0
#: A re-pin inside a group restarts only the member's rollout engine (a warm switch).
DEFAULT_REPIN_RESTART_S = 2.0
_GBIT_PER_GIB = 8 * float(1 << 30) / 1e9


@dataclass(frozen=True, slots=True)
class MoveCost:
    """What moving a running job's warm state costs: its pause, in seconds.

    A job that moves to another group copies its warm state node to node inside each
    pool (rollout state over the rollout pool's fabric, training state over the training
    pool's; each node copies its own share in parallel, so the two copies overlap) and
    restarts its workers there. A re-pin inside a group copies only the rollout state
    to another rollout node of the group. Bandwidths are the site's network tiers
    (``[network] intra_pool_gbps``; a move never crosses the inter-pool link).
    """

    rollout_gbps: float = 400.0
    train_gbps: float = 400.0
    restart_s: float = DEFAULT_MOVE_RESTART_S
    repin_restart_s: float = DEFAULT_REPIN_RESTART_S

    def __post_init__(self) -> None:
        for name in ("rollout_gbps", "train_gbps"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"move cost {name} {value!r}: expected a bandwidth > 0 Gb/s")
        for name in ("restart_s", "repin_restart_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"move cost {name} {value!r}: expected seconds >= 0")

    @classmethod
    def from_site(cls, site: SiteConfig, restart_s: float = DEFAULT_MOVE_RESTART_S
                  ) -> MoveCost:
        gbps = site.network.intra_pool_gbps
        return cls(gbps, gbps, restart_s)

    def copy_s(self, rollout_gib: float, train_gib: float) -> float:
        """Seconds to copy one node's rollout and one node's training state (in parallel)."""
        return max(rollout_gib * _GBIT_PER_GIB / self.rollout_gbps,
                   train_gib * _GBIT_PER_GIB / self.train_gbps)

    def move_s(self, rollout_gib: float, train_gib: float) -> float:
        """Pause of a member moving to another group (state per node, GiB)."""
        return self.copy_s(rollout_gib, train_gib) + self.restart_s

    def repin_s(self, rollout_gib: float) -> float:
        """Pause of a member re-pinned to other rollout nodes of its own group."""
        return self.copy_s(rollout_gib, 0.0) + self.repin_restart_s
