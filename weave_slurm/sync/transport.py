"""Point-to-point and pool-local collectives over torch.distributed (NCCL or gloo).

This and :mod:`weave_slurm.sync.mpi` are the only modules that talk to a
communication library. Every wait is bounded by the transport's timeout and every
library error is raised as a :class:`SyncError` naming the operation and the peer.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator
from typing import Protocol

import torch
import torch.distributed as dist

from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.topology import SyncTopology
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)


class Pending(Protocol):
    def wait(self) -> None: ...


class Transport(Protocol):
    """What the sync needs from a communication library."""

    rank: int
    device: torch.device

    def isend(self, buf: torch.Tensor, dst: int, tag: int) -> Pending: ...

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending: ...

    def all_gather(self, out: list[torch.Tensor], mine: torch.Tensor, pool: Pool) -> None: ...

    def broadcast(self, buf: torch.Tensor, src: int, pool: Pool | None) -> None: ...

    def barrier(self) -> None: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def guarded(what: str) -> Iterator[None]:
    """Turn a communication library's error into a one-line :class:`SyncError`."""
    try:
        yield
    except SyncError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SyncError(f"{what}: {first}") from exc


class _TorchPending:
    def __init__(self, work: dist.Work | None, what: str, timeout_s: float) -> None:
        if work is None:
            raise SyncError(f"{what}: this rank is not a member of the operation's group")
        self._work, self._what, self._timeout_s = work, what, timeout_s

    def wait(self) -> None:
        with guarded(self._what):
            self._work.wait(timeout=datetime.timedelta(seconds=self._timeout_s))


class TorchTransport:
    """torch.distributed: NCCL when ``device`` is a GPU, gloo on CPU."""

    def __init__(self, topology: SyncTopology, rank: int, init_method: str,
                 timeout_s: float = 60.0, device: str = "cpu") -> None:
        self.rank = rank
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        with guarded(f"init_process_group({backend}, {init_method}, rank {rank})"):
            dist.init_process_group(
                backend, init_method=init_method, rank=rank, world_size=topology.world_size,
                timeout=datetime.timedelta(seconds=timeout_s))
            self._groups = {pool: dist.new_group(list(_ranks(topology, pool)))
                            for pool in (Pool.TRAIN, Pool.ROLLOUT)}
        self._pool = topology.info(rank).pool
        log.debug("rank %d joined %s sync group of %d", rank, backend, topology.world_size)

    def isend(self, buf: torch.Tensor, dst: int, tag: int) -> Pending:
        what = f"send {buf.numel() * buf.element_size()} B to rank {dst}"
        with guarded(what):
            return _TorchPending(dist.isend(buf, dst, tag=tag), what, self.timeout_s)

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending:
        what = f"receive {buf.numel() * buf.element_size()} B from rank {src}"
        with guarded(what):
            return _TorchPending(dist.irecv(buf, src, tag=tag), what, self.timeout_s)

    def all_gather(self, out: list[torch.Tensor], mine: torch.Tensor, pool: Pool) -> None:
        what = f"all-gather of {len(out)} x {mine.numel()} B in pool {pool.value!r}"
        with guarded(what):
            work = dist.all_gather(out, mine, group=self._groups[pool], async_op=True)
            _TorchPending(work, what, self.timeout_s).wait()

    def broadcast(self, buf: torch.Tensor, src: int, pool: Pool | None) -> None:
        group = None if pool is None else self._groups[pool]
        what = f"broadcast of {buf.numel()} B from rank {src}"
        with guarded(what):
            work = dist.broadcast(buf, src, group=group, async_op=True)
            _TorchPending(work, what, self.timeout_s).wait()

    def barrier(self) -> None:
        with guarded("barrier"):
            t = torch.zeros(1, device=self.device)
            work = dist.all_reduce(t, async_op=True)
            _TorchPending(work, "barrier", self.timeout_s).wait()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _ranks(topology: SyncTopology, pool: Pool) -> tuple[int, ...]:
    return topology.train_ranks if pool is Pool.TRAIN else topology.rollout_ranks
