"""Node failures injected into a replay: when, which node, and what a job loses.

Failures form a Poisson process at ``rate_per_node_hour`` per node in use; the next
failure is drawn with the rate of the nodes held at the time it is scheduled (memoryless,
so this is exact between changes of the node count and a close approximation across
them). The failed node is drawn uniformly among the nodes in use. The jobs on it (every
member of the group for a training node, the members pinned to it for a rollout node)
roll back to their last checkpoint (every ``checkpoint_every_iterations`` iterations),
are re-admitted through the placement policy, and make no progress for ``restart_s``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from weave_slurm.errors import ConfigError
from weave_slurm.placement.group import Group

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class FailureModel:
    rate_per_node_hour: float
    checkpoint_every_iterations: int = 10
    restart_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.rate_per_node_hour) or self.rate_per_node_hour < 0:
            raise ConfigError(f"--failure-rate {self.rate_per_node_hour!r}: expected a rate "
                              f">= 0 failures per node-hour")
        if self.checkpoint_every_iterations < 1:
            raise ConfigError(f"checkpoint_every_iterations {self.checkpoint_every_iterations!r}:"
                              f" expected an integer >= 1")

    def next_failure_in_s(self, rng: random.Random, nodes_in_use: float) -> float:
        """Seconds to the next failure (inf when nothing is held or the rate is 0)."""
        rate_per_s = self.rate_per_node_hour * nodes_in_use / SECONDS_PER_HOUR
        return rng.expovariate(rate_per_s) if rate_per_s > 0 else math.inf

    def lost_iterations(self, done_iterations: float) -> float:
        """Progress since the last checkpoint, lost on a failure."""
        every = self.checkpoint_every_iterations
        return done_iterations - math.floor(done_iterations / every) * every


@dataclass(frozen=True, slots=True)
class NodeFailure:
    group_id: int
    pool: str  # "rollout" or "train"
    node: int  # index inside the group
    jobs: tuple[str, ...]  # job ids hit


def pick_failure(groups: tuple[Group, ...], rng: random.Random) -> NodeFailure | None:
    """A uniformly random node among those the groups hold, and the jobs on it (a pooled
    group's rollout GPUs count as the share of nodes they are, and a failure among them
    hits every member: each member's rollout spans them all)."""
    total = sum(g.rollout_held_nodes + g.train_nodes for g in groups)
    if total <= 0:
        return None
    # whole nodes: an integer draw (as before pools; the same failures for a seed)
    pick: float = rng.randrange(total) if isinstance(total, int) else rng.random() * total
    for g in groups:
        if pick < g.train_nodes:
            return NodeFailure(g.group_id, "train", int(pick), g.job_ids)
        pick -= g.train_nodes
        if pick < g.rollout_held_nodes:
            node = 0 if g.pooled else int(pick)
            hit = tuple(m.job.job_id for m in g.members if node in m.rollout_pins)
            return NodeFailure(g.group_id, "rollout", node, hit)
        pick -= g.rollout_held_nodes
    return None
