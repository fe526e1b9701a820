"""One rank of a launched sync group (``python -m weave_slurm.sync.group_rank SPEC RESULTS``).

Started by :mod:`weave_slurm.sync.group_launch`, inside its pool's namespace. Reads the
:class:`Scenario`, joins the group (gloo via ``WEAVE_SYNC_INIT``/``WEAVE_SYNC_RANK``,
or MPI under ``mpirun``), pushes or receives every version, checks the rollout side's
weights against the trainer's file byte for byte, and writes one JSON result per rank.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

from weave_slurm.errors import VersionMismatch, WeaveError
from weave_slurm.sync.naive_syncs import flat_broadcast, naive_pull
from weave_slurm.sync.pieces import is_payload_tag
from weave_slurm.sync.scenario import Backend, Method, Scenario
from weave_slurm.sync.topology import ShardLayout, SyncTopology
from weave_slurm.sync.transport import Pending, TorchTransport, Transport
from weave_slurm.sync.twotier import FaultPlan, SyncConfig, TwoTierSync
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)


class _DyingTransport:
    """Fault hook: SIGKILL this process when it starts receiving a payload."""

    def __init__(self, inner: Transport) -> None:
        self.inner, self.rank, self.device = inner, inner.rank, inner.device
        self.armed = False

    def isend(self, buf: torch.Tensor, dst: int, tag: int) -> Pending:
        return self.inner.isend(buf, dst, tag)

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending:
        if self.armed and is_payload_tag(tag):
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.irecv(buf, src, tag)

    def all_gather(self, out: list[torch.Tensor], mine: torch.Tensor, pool: Pool) -> None:
        self.inner.all_gather(out, mine, pool)

    def broadcast(self, buf: torch.Tensor, src: int, pool: Pool | None) -> None:
        self.inner.broadcast(buf, src, pool)

    def barrier(self) -> None:
        self.inner.barrier()

    def close(self) -> None:
        self.inner.close()


def _attach(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def _fill(flat: torch.Tensor, src: torch.Tensor, sync: TwoTierSync | None, rank: int) -> None:
    """Put the new version into a training rank's buffer (two-tier: only its own pieces)."""
    if sync is None:
        flat[:src.numel()].copy_(src)
        return
    size = sync.layout.shard_nbytes
    for p in sync.plan:
        if p.src == rank:
            start = p.shard * size + p.offset
            end = min(start + p.nbytes, src.numel())
            flat[start:start + p.nbytes].zero_()
            if start < end:
                flat[start:end].copy_(src[start:end])


def _connect(sc: Scenario, topo: SyncTopology) -> Transport:
    if sc.backend is Backend.MPI:
        from weave_slurm.sync.mpi import MpiTransport

        return MpiTransport(topo, timeout_s=sc.timeout_s)
    return TorchTransport(topo, int(os.environ["WEAVE_SYNC_RANK"]),
                          os.environ["WEAVE_SYNC_INIT"], timeout_s=sc.timeout_s)


def _step(sc: Scenario, topo: SyncTopology, t: Transport, sync: TwoTierSync | None,
          flat: torch.Tensor, i: int) -> dict[str, Any]:
    """One push/receive; on training ranks ``flat`` is the resident weight buffer, which
    gets version ``i`` before the timed part (as a trainer's optimizer step would)."""
    pool = topo.info(t.rank).pool
    version = sc.versions[i]
    buf = flat
    if pool is Pool.TRAIN and sync is not None:
        _fill(flat, _attach(sc.version_files[i], sc.total_nbytes), sync, t.rank)
    elif pool is Pool.TRAIN and (sc.method is Method.NAIVE or t.rank == topo.train_ranks[0]):
        buf = _attach(sc.version_files[i], sc.total_nbytes)  # shared pages: no extra memory
        int(buf[::4096].sum())  # fault the mapping in before the clock starts
    out: dict[str, Any] = {"version": version, "ok": True}
    t.barrier()
    start = time.perf_counter()
    if sync is not None:
        report = sync.push(flat, version) if pool is Pool.TRAIN else sync.receive(flat)
        out.update(slow_link_bytes=report.slow_link_bytes, full_pieces=report.full_pieces,
                   delta_pieces=report.delta_pieces, retries=report.retries,
                   stages_s=report.stages_s)
    elif sc.method is Method.NAIVE:
        out["slow_link_bytes"] = naive_pull(t, topo, buf[:sc.total_nbytes])
    else:
        out["slow_link_bytes"] = flat_broadcast(t, topo, buf[:sc.total_nbytes])
    out["elapsed_s"] = time.perf_counter() - start
    if pool is Pool.ROLLOUT and sc.verify:
        expect = _attach(sc.version_files[i], sc.total_nbytes)
        out["identical"] = bool(torch.equal(flat[:sc.total_nbytes], expect))
    return out


def run_rank(sc: Scenario) -> dict[str, Any]:
    topo = sc.topology()
    t: Transport = _connect(sc, topo)
    if sc.die_rank == t.rank:
        t = _DyingTransport(t)
    pool = topo.info(t.rank).pool
    layout = ShardLayout(sc.total_nbytes, sc.n_rollout)
    sync = None
    if sc.method is Method.TWOTIER:
        config = SyncConfig(sc.job_id, sc.mode, verify_gather=sc.verify_gather,
                            chunk_nbytes=sc.chunk_nbytes)
        sync = TwoTierSync(t, topo, layout, sc.word_bytes, config,
                           fault=FaultPlan(sc.corrupt_attempts))
    # allocated once and reused by every version, so no timed sync touches fresh memory:
    # rollout ranks (and broadcast receivers) zero theirs, two-tier training ranks touch
    # the pieces they fill before each push, baseline senders send from the shared file
    if pool is Pool.ROLLOUT or (sc.method is Method.FLAT and t.rank != topo.train_ranks[0]):
        flat = torch.zeros(layout.padded_nbytes, dtype=torch.uint8)
    else:
        flat = torch.empty(layout.padded_nbytes if sync is not None else 0, dtype=torch.uint8)
    steps: list[dict[str, Any]] = []
    result: dict[str, Any] = {"rank": t.rank, "pool": pool.value, "node": topo.info(t.rank).node,
                              "host": socket.gethostname(), "steps": steps}
    for i in range(len(sc.versions)):
        if isinstance(t, _DyingTransport):
            t.armed = i == sc.die_at
        try:
            steps.append(_step(sc, topo, t, sync, flat, i))
        except VersionMismatch as exc:
            steps.append({"version": sc.versions[i], "ok": False,
                          "error": type(exc).__name__, "message": str(exc)})
        except WeaveError as exc:
            steps.append({"version": sc.versions[i], "ok": False,
                          "error": type(exc).__name__, "message": str(exc)})
            break
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("WEAVE_LOG", "WARNING"),
                        format="%(asctime)s rank? %(name)s %(levelname)s %(message)s")
    sc = Scenario.load(Path(args[0]))
    torch.set_num_threads(1)
    result = run_rank(sc)
    out = Path(args[1]) / f"rank{result['rank']}.json"
    out.write_text(json.dumps(result))
    if sc.backend is Backend.MPI and all(step["ok"] for step in result["steps"]):
        from mpi4py import MPI

        MPI.Finalize()  # a clean exit for mpirun; skipped after errors (peers may be gone)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip process-group teardown: a dead peer must not hang the exit


if __name__ == "__main__":
    raise SystemExit(main())
