"""The two naive syncs the two-tier sync is measured against (benchmarks only).

* naive pull: every rollout rank fetches a full copy across the slow link (from
  training rank ``i % n_train``), all in parallel: ``n_rollout x`` the slow-link bytes.
* flat broadcast: one broadcast from training rank 0 spanning both pools.

Neither carries headers or checksums: they are lower bounds for the naive designs.
"""

from __future__ import annotations

import torch

from weave_slurm.sync.topology import SyncTopology
from weave_slurm.sync.transport import Transport
from weave_slurm.vocab import Pool

_TAG = 7_000_000


def naive_pull(t: Transport, topology: SyncTopology, flat: torch.Tensor) -> int:
    """Training ranks send ``flat`` whole to their rollout ranks, which receive into it.
    Returns the slow-link bytes this rank moved."""
    train, rollout = topology.train_ranks, topology.rollout_ranks
    if topology.info(t.rank).pool is Pool.TRAIN:
        mine = [r for i, r in enumerate(rollout) if train[i % len(train)] == t.rank]
        pending = [t.isend(flat, r, _TAG) for r in mine]
        for w in pending:
            w.wait()
        return flat.numel() * len(mine)
    src = train[rollout.index(t.rank) % len(train)]
    t.irecv(flat, src, _TAG).wait()
    return flat.numel()


def flat_broadcast(t: Transport, topology: SyncTopology, flat: torch.Tensor) -> int:
    """One broadcast from the first training rank over every rank of both pools."""
    t.broadcast(flat, topology.train_ranks[0], None)
    return flat.numel()
