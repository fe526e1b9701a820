"""The limits placement must respect, derived from the site config (pure).

Both the cluster state (:mod:`~weave_slurm.placement.cluster_state`) and the pooled-group
widths (:mod:`~weave_slurm.placement.pooled`) decide within them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from weave_slurm.config.site import SiteConfig
from weave_slurm.model.cost import CostRates, MoveCost
from weave_slurm.placement.group import Group


@dataclass(frozen=True, slots=True)
class Capacity:
    """Limits placement must respect, derived from the site config."""

    max_group_size: int
    max_rollout_nodes_per_group: int
    rollout_mem_gib: float
    train_mem_gib: float
    rollout_pool_nodes: int
    train_pool_nodes: int
    rates: CostRates
    moves: MoveCost = field(default_factory=MoveCost)  # what moving a running job costs
    # device memory of one GPU of each pool (GiB; the site's gpu hbm_gib; inf: unchecked)
    rollout_gpu_mem_gib: float = math.inf
    train_gpu_mem_gib: float = math.inf
    # weave's groups pool their rollout side in GPUs (docs/placement.md "Pooled
    # rollout"); rollout node counts above stay in nodes
    rollout_pooled: bool = False
    rollout_gpus_per_node: int = 8
    # weave may admit a job co-located: its rollout on its own training nodes, no
    # rollout node held (docs/placement.md "Co-location"; weaved: the site's [limits]
    # colocation, daemon/colocating.py)
    colocation: bool = False

    def rate_of(self, group: Group) -> float:
        """What ``group``'s nodes cost per hour (a pool's GPUs as the nodes' share)."""
        return self.rates.rate(group.rollout_held_nodes, group.train_nodes)

    def fits(self, group: Group) -> bool:
        """``group.feasible`` under these limits (host memory, device memory, SLOs)."""
        return group.feasible(self.rollout_mem_gib, self.train_mem_gib,
                              self.rollout_gpu_mem_gib, self.train_gpu_mem_gib)

    @classmethod
    def from_site(cls, site: SiteConfig, max_group_size: int | None = None,
                  pooled: bool = False, colocation: bool | None = None) -> Capacity:
        """The site's limits (``colocation``: None takes the site's ``[limits]
        colocation``)."""
        return cls(
            rollout_pooled=pooled, rollout_gpus_per_node=site.rollout.gpus_per_node,
            colocation=bool(site.limits.colocation) if colocation is None else colocation,
            max_group_size=max_group_size or site.limits.max_group_size,
            max_rollout_nodes_per_group=site.limits.max_rollout_nodes_per_group,
            rollout_mem_gib=site.rollout.host_mem_gib, train_mem_gib=site.train.host_mem_gib,
            rollout_pool_nodes=site.rollout.max_nodes, train_pool_nodes=site.train.max_nodes,
            rates=CostRates.from_site(site), moves=MoveCost.from_site(site),
            rollout_gpu_mem_gib=site.rollout.gpu.hbm_gib,
            train_gpu_mem_gib=site.train.gpu.hbm_gib)
