"""Which ranks take part in a weight sync, in which pool and on which node.

The group runtime derives a :class:`SyncTopology` from the group's Slurm allocations
(one :class:`PoolNodes` per node: its pool, its ``SLURMD_NODENAME`` and the number of
sync ranks on it) through :func:`build_topology`. Training ranks come first in the
global rank order, then rollout ranks; inside each pool ranks are interleaved across
nodes (node0/local0, node1/local0, ..., node0/local1, ...) so that consecutive
slow-link streams start on different nodes and use every node's uplink.

:func:`plan_streams` is the pure stage-1 plan: which training rank sends which byte
range of which rollout shard to which rollout rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Pool

ALIGN_BYTES = 64


@dataclass(frozen=True)
class PoolNodes:
    """One node of an allocation as seen by the sync: ``n_ranks`` sync ranks on ``node``."""

    pool: Pool
    node: str
    n_ranks: int


@dataclass(frozen=True)
class RankInfo:
    """One sync rank: its global rank, pool, node name and index among the node's ranks."""

    rank: int
    pool: Pool
    node: str
    local_index: int


@dataclass(frozen=True)
class SyncTopology:
    """All ranks of one sync group; training ranks first, then rollout ranks."""

    ranks: tuple[RankInfo, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def train_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.pool is Pool.TRAIN)

    @property
    def rollout_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.pool is Pool.ROLLOUT)

    def info(self, rank: int) -> RankInfo:
        if not 0 <= rank < len(self.ranks):
            raise ConfigError(f"sync rank {rank!r} out of range: valid 0..{len(self.ranks) - 1}")
        return self.ranks[rank]

    def nodes(self, pool: Pool) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for r in self.ranks:
            if r.pool is pool:
                seen.setdefault(r.node, None)
        return tuple(seen)


def build_topology(nodes: Sequence[PoolNodes]) -> SyncTopology:
    """Build the topology from per-node rank counts (as derived from Slurm allocations)."""
    names: set[tuple[Pool, str]] = set()
    for pn in nodes:
        if pn.n_ranks < 1:
            raise ConfigError(f"node {pn.node!r}: n_ranks must be >= 1, got {pn.n_ranks!r}")
        if (pn.pool, pn.node) in names:
            raise ConfigError(f"node {pn.node!r} listed twice in pool {pn.pool.value!r}")
        names.add((pn.pool, pn.node))
    ranks: list[RankInfo] = []
    for pool in (Pool.TRAIN, Pool.ROLLOUT):
        pool_nodes = [pn for pn in nodes if pn.pool is pool]
        if not pool_nodes:
            raise ConfigError(
                f"sync topology has no {pool.value!r} nodes; needs at least one per pool "
                f"(valid pools: {', '.join(p.value for p in Pool)})")
        deepest = max(pn.n_ranks for pn in pool_nodes)
        for local in range(deepest):
            for pn in pool_nodes:
                if local < pn.n_ranks:
                    ranks.append(RankInfo(len(ranks), pool, pn.node, local))
    return SyncTopology(tuple(ranks))


@dataclass(frozen=True)
class ShardLayout:
    """A flat weight buffer of ``total_nbytes`` cut into one equal shard per rollout rank.

    Shards are ``ALIGN_BYTES``-aligned; the last may reach past ``total_nbytes`` (padding
    that the sender fills with zeros, so every shard has the same size for all-gather).
    """

    total_nbytes: int
    n_shards: int

    @property
    def shard_nbytes(self) -> int:
        per = -(-self.total_nbytes // self.n_shards)
        return -(-per // ALIGN_BYTES) * ALIGN_BYTES

    @property
    def padded_nbytes(self) -> int:
        return self.shard_nbytes * self.n_shards


@dataclass(frozen=True)
class StreamPiece:
    """Stage 1: training rank ``src`` sends ``nbytes`` at ``offset`` of shard ``shard``
    to rollout rank ``dst`` (the shard's owner). ``piece`` numbers pieces globally."""

    piece: int
    src: int
    dst: int
    shard: int
    offset: int
    nbytes: int


def plan_streams(topology: SyncTopology, layout: ShardLayout) -> tuple[StreamPiece, ...]:
    """Pure stage-1 plan: every rollout shard crosses the slow link exactly once.

    With at least as many training as rollout ranks, the training ranks ``t`` with
    ``t % n_rollout == s`` split shard ``s`` between them, so every training rank sends;
    with fewer, training rank ``s % n_train`` sends whole shards.
    """
    train, rollout = topology.train_ranks, topology.rollout_ranks
    if layout.n_shards != len(rollout):
        raise ConfigError(
            f"shard count {layout.n_shards!r} must equal the number of rollout ranks "
            f"({len(rollout)})")
    pieces: list[StreamPiece] = []
    for s, dst in enumerate(rollout):
        senders = [t for i, t in enumerate(train) if i % len(rollout) == s]
        if not senders:
            senders = [train[s % len(train)]]
        blocks = layout.shard_nbytes // ALIGN_BYTES
        senders = senders[:blocks]
        offset = 0
        for i, src in enumerate(senders):
            nbytes = (blocks // len(senders) + (i < blocks % len(senders))) * ALIGN_BYTES
            pieces.append(StreamPiece(len(pieces), src, dst, s, offset, nbytes))
            offset += nbytes
    return tuple(pieces)
