"""A member's view of a group-wide sync world: a few of its ranks, renumbered.

A co-execution group keeps one process group for all its nodes (one sync rank per
node), but each member's weights go only from its training node to the rollout nodes
it is pinned to. :class:`SubTransport` presents those ranks to
:class:`~weave_slurm.sync.twotier.TwoTierSync` as a world of their own (training rank
first, then rollout ranks, as :func:`~weave_slurm.sync.topology.build_topology` numbers
them). Point-to-point messages go to the mapped global ranks; the rollout pool's small
all-gather is done with point-to-point messages among the member's rollout ranks, so
no collective group has to be created (a ``new_group`` would need every rank of the
world to call it, members join at any time). Only the operations the two-tier sync
uses are supported.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.topology import PoolNodes, SyncTopology, build_topology
from weave_slurm.sync.transport import Pending, Transport
from weave_slurm.vocab import Pool

#: Tag of the rollout pool's all-gather messages: above every piece tag of a sync.
GATHER_TAG = 1 << 30


def member_topology(train_nodes: str | Sequence[str],
                    rollout_nodes: Sequence[str]) -> SyncTopology:
    """One sync rank on each of the member's training nodes that send (its training
    node; a gang over several nodes: each of them, rank 0's first), one on each of its
    rollout nodes."""
    senders = (train_nodes,) if isinstance(train_nodes, str) else tuple(train_nodes)
    return build_topology([*(PoolNodes(Pool.TRAIN, n, 1) for n in senders),
                           *(PoolNodes(Pool.ROLLOUT, n, 1) for n in rollout_nodes)])


class SubTransport:
    """Ranks ``global_ranks[i]`` of ``inner``'s world, seen as ranks ``0..n-1``."""

    def __init__(self, inner: Transport, topology: SyncTopology,
                 global_ranks: Sequence[int]) -> None:
        if len(global_ranks) != topology.world_size or len(set(global_ranks)) != len(
                global_ranks):
            raise SyncError(f"sub-group: {len(global_ranks)} distinct global ranks needed for "
                            f"a {topology.world_size}-rank topology, got {list(global_ranks)}")
        if inner.rank not in global_ranks:
            raise SyncError(f"sub-group: rank {inner.rank} is not one of {list(global_ranks)}")
        self.inner, self.topology = inner, topology
        self.global_ranks = tuple(global_ranks)
        self.rank = self.global_ranks.index(inner.rank)
        self.device = inner.device

    def isend(self, buf: torch.Tensor, dst: int, tag: int) -> Pending:
        return self.inner.isend(buf, self.global_ranks[dst], tag)

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending:
        return self.inner.irecv(buf, self.global_ranks[src], tag)

    def all_gather(self, out: list[torch.Tensor], mine: torch.Tensor, pool: Pool) -> None:
        ranks = self.topology.train_ranks if pool is Pool.TRAIN else self.topology.rollout_ranks
        if self.rank not in ranks or len(out) != len(ranks):
            raise SyncError(f"sub-group all-gather in pool {pool.value!r}: rank {self.rank} "
                            f"with {len(out)} outputs for ranks {list(ranks)}")
        pending: list[Pending] = []
        for i, r in enumerate(ranks):
            if r == self.rank:
                out[i].copy_(mine)
                continue
            pending.append(self.isend(mine, r, GATHER_TAG))
            pending.append(self.irecv(out[i], r, GATHER_TAG))
        for p in pending:
            p.wait()

    def broadcast(self, buf: torch.Tensor, src: int, pool: Pool | None) -> None:
        raise SyncError("sub-group: broadcast is not supported (the two-tier sync relays)")

    def barrier(self) -> None:
        raise SyncError("sub-group: barrier is not supported (use the group's transport)")

    def close(self) -> None:
        """The group's transport outlives its members' views."""
