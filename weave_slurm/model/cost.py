"""Cost rates of nodes and groups (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.config.site import SiteConfig


@dataclass(frozen=True, slots=True)
class CostRates:
    """Price per node-hour of each pool, in the site's currency."""

    rollout_node_hour: float
    train_node_hour: float

    @classmethod
    def from_site(cls, site: SiteConfig) -> CostRates:
        return cls(site.rollout.price_per_node_hour, site.train.price_per_node_hour)

    def rate(self, rollout_nodes: float, train_nodes: float) -> float:
        """Cost per hour of holding this many nodes of each pool."""
        return rollout_nodes * self.rollout_node_hour + train_nodes * self.train_node_hour
