"""A training gang's world inside its ranks' resident workers.

The runtime chooses where a gang's world meets (``PhaseArgs.init_method``,
``tcp://<rank 0's node>:<port>``) and activates every rank's phase with it; each
rank's resident worker joins on its first phase (:func:`gang_world`) and keeps the
world across phases, so a warm switch builds no process group. Backend: NCCL when the
rank's device is a GPU (``cuda:<local rank>``), gloo on CPU, gloo's interface the one
towards rank 0's node (:func:`~weave_slurm.sync.netif.use_interface_towards`).

A worker joins one world only: a phase that names another rendezvous (the gang was
formed again, e.g. after a rank was lost) is refused, since a process group with a
lost peer cannot be reused; the runtime stops a failed gang's workers, so a new world
is always joined by fresh ones.

:func:`share_batch` hands rank 0's batch to every rank (each rank trains on its share
of the whole batch: docs/job_api.md); the batch travels once, over the gang's world.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import StateError
from weave_slurm.sync.netif import use_interface_towards

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from weave_slurm.hosted.contract import PhaseArgs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class World:
    """The world this worker joined: where, as which rank, on which device."""

    init_method: str
    rank: int
    world_size: int
    device: str
    group: ProcessGroup


_WORLD: World | None = None


def device_of(local_rank: int) -> str:
    """The rank's device: its GPU on the node when the node has GPUs, else the CPU."""
    import torch

    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


def gang_world(args: PhaseArgs, where: str) -> World | None:
    """The world of this rank's gang, joined on first use (None: a single rank)."""
    global _WORLD
    if args.world_size <= 1:
        return None
    if args.init_method is None:
        raise StateError(f"{where}: rank {args.rank} of a gang of {args.world_size} has no "
                         f"rendezvous (init_method)")
    held = _WORLD
    if held is not None:
        if (held.init_method, held.rank, held.world_size) != \
                (args.init_method, args.rank, args.world_size):
            raise StateError(f"{where}: this worker is rank {held.rank} of {held.world_size} "
                             f"at {held.init_method}; the phase wants rank {args.rank} of "
                             f"{args.world_size} at {args.init_method} (a world is never "
                             f"joined twice)")
        return held
    import torch.distributed as dist

    device = device_of(args.local_rank)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    host = args.init_method.removeprefix("tcp://").rpartition(":")[0]
    iface = use_interface_towards(host) if backend == "gloo" else None
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(device)
    log.info("%s: joining %s world %s as rank %d of %d (interface %s)", where, backend,
             args.init_method, args.rank, args.world_size, iface)
    dist.init_process_group(backend, init_method=args.init_method, rank=args.rank,
                            world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.world_timeout_s))
    group = dist.group.WORLD
    assert group is not None
    _WORLD = World(args.init_method, args.rank, args.world_size, device, group)
    return _WORLD


def share_weights(world: World | None, weights: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's full ``weights`` on every rank (a collective: the names, shapes and dtypes
    once, then one broadcast per tensor over the gang's own fast network), so that each
    training node can send its part of a sharded weight sync. A single rank keeps its own."""
    if world is None:
        return weights
    import torch
    import torch.distributed as dist

    meta = share_batch(world, {k: (tuple(v.shape), str(v.dtype).removeprefix("torch."))
                               for k, v in weights.items()} if world.rank == 0 else None)
    out: dict[str, Any] = {}
    for name, (shape, dtype) in meta.items():
        t = weights[name].contiguous() if world.rank == 0 else \
            torch.empty(shape, dtype=getattr(torch, dtype), device=world.device)
        dist.broadcast(t, src=0, group=world.group)
        out[name] = t
    return out


def share_batch(world: World | None, payload: Any) -> Any:
    """Rank 0's ``payload`` on every rank (a collective; ``payload`` is read on rank 0
    only). A single rank keeps its own."""
    if world is None:
        return payload
    import torch.distributed as dist

    box = [payload if world.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=world.group)
    return box[0]
