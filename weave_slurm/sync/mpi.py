"""The MPI path of the sync (mpi4py), for sites that prefer MPI to gloo on CPU.

Implements the same :class:`~weave_slurm.sync.transport.Transport` as the torch
transport. MPI has no timeouts, so every wait polls its request against a deadline
and raises :class:`SyncError` when it passes; errors are returned, not fatal
(``ERRORS_RETURN``). CPU tensors only (buffers are shared with numpy, no copies).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.topology import SyncTopology
from weave_slurm.sync.transport import Pending, guarded
from weave_slurm.vocab import Pool

_POLL_S = 0.0005


def _np(buf: torch.Tensor) -> Any:
    if buf.device.type != "cpu" or not buf.is_contiguous():
        raise SyncError(f"MPI transport needs contiguous CPU tensors, got {buf.device} "
                        f"contiguous={buf.is_contiguous()}")
    return buf.view(torch.uint8).numpy() if buf.dtype == torch.bfloat16 else buf.numpy()


class _MpiPending:
    def __init__(self, req: Any, what: str, timeout_s: float) -> None:
        self._req, self._what, self._timeout_s = req, what, timeout_s

    def wait(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        with guarded(self._what):
            while not self._req.Test():
                if time.monotonic() > deadline:
                    raise SyncError(f"{self._what}: no progress in {self._timeout_s:g} s "
                                    "(peer dead or stuck)")
                time.sleep(_POLL_S)


class MpiTransport:
    """mpi4py over ``COMM_WORLD``; the rank order must match the topology's."""

    def __init__(self, topology: SyncTopology, timeout_s: float = 60.0) -> None:
        from mpi4py import MPI  # optional dependency, imported only on this path

        self._mpi = MPI
        self._world = MPI.COMM_WORLD
        self._world.Set_errhandler(MPI.ERRORS_RETURN)
        if self._world.Get_size() != topology.world_size:
            raise SyncError(f"mpirun started {self._world.Get_size()} ranks, the sync topology "
                            f"has {topology.world_size}")
        self.rank = self._world.Get_rank()
        self.device = torch.device("cpu")
        self.timeout_s = timeout_s
        pool = topology.info(self.rank).pool
        self._pool_comm = self._world.Split(0 if pool is Pool.TRAIN else 1, self.rank)
        self._pool = pool

    def isend(self, buf: torch.Tensor, dst: int, tag: int) -> Pending:
        what = f"MPI send {buf.numel() * buf.element_size()} B to rank {dst}"
        with guarded(what):
            return _MpiPending(self._world.Isend(_np(buf), dest=dst, tag=tag), what,
                               self.timeout_s)

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending:
        what = f"MPI receive {buf.numel() * buf.element_size()} B from rank {src}"
        with guarded(what):
            return _MpiPending(self._world.Irecv(_np(buf), source=src, tag=tag), what,
                               self.timeout_s)

    def _comm(self, pool: Pool | None) -> Any:
        if pool is None:
            return self._world
        if pool is not self._pool:
            raise SyncError(f"rank {self.rank} is not in pool {pool.value!r}")
        return self._pool_comm

    def all_gather(self, out: list[torch.Tensor], mine: torch.Tensor, pool: Pool) -> None:
        what = f"MPI all-gather of {len(out)} x {mine.numel()} B in pool {pool.value!r}"
        n = mine.numel()
        base = out[0]
        contiguous = all(o.data_ptr() == base.data_ptr() + i * n * mine.element_size()
                         for i, o in enumerate(out))
        target = (base.as_strided((n * len(out),), (1,)) if contiguous
                  else torch.empty(n * len(out), dtype=mine.dtype))
        with guarded(what):
            req = self._comm(pool).Iallgather(_np(mine.contiguous()), _np(target))
            _MpiPending(req, what, self.timeout_s).wait()
        if not contiguous:
            for i, o in enumerate(out):
                o.copy_(target[i * n:(i + 1) * n])

    def broadcast(self, buf: torch.Tensor, src: int, pool: Pool | None) -> None:
        comm = self._comm(pool)
        root = src if pool is None else self._world_to_pool(src, comm)
        what = f"MPI broadcast of {buf.numel()} B from rank {src}"
        with guarded(what):
            _MpiPending(comm.Ibcast(_np(buf), root=root), what, self.timeout_s).wait()

    def _world_to_pool(self, world_rank: int, comm: Any) -> int:
        group_world = self._world.Get_group()
        return int(self._mpi.Group.Translate_ranks(group_world, [world_rank],
                                                   comm.Get_group())[0])

    def barrier(self) -> None:
        with guarded("MPI barrier"):
            _MpiPending(self._world.Ibarrier(), "MPI barrier", self.timeout_s).wait()

    def close(self) -> None:
        self._pool_comm.Free()
