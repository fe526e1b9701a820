"""The rollout side of one round of the two-tier sync: receive, relay, verify.

Every rollout rank takes in every piece of the round: its own pieces from their training
ranks over the slow link, the others from their owners (the relay, stage 2). The owner
forwards each chunk to its peers as soon as it has arrived, so the intra-pool transfer
runs while the slow link is still busy. A full piece of a fresh version is received
straight into the rank's weight buffer (no staging copies); its chunks are checksummed
as they arrive, while later chunks are still in flight. Refused pieces (stale version,
wrong job, missing delta base) go to reusable scratch space so the weights stay intact.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from weave_slurm.sync.delta import apply_delta
from weave_slurm.sync.header import PieceHeader, Status, SyncMode, empty_header
from weave_slurm.sync.pieces import Slot, chunk_crcs, chunk_spans, crc32_into, tag
from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.topology import ShardLayout, StreamPiece
from weave_slurm.sync.transport import Pending, Transport
from weave_slurm.sync.version_ledger import VersionLedger

log = logging.getLogger(__name__)


@dataclass
class _Intake:
    """One piece arriving at this rank in this round."""

    piece: StreamPiece
    src: int
    relay: bool  # True: from the shard's owner (stage 2); False: from a training rank
    head_buf: torch.Tensor
    head_wait: Pending
    head: PieceHeader | None = None
    status: Status = Status.OK
    dest: torch.Tensor | None = None  # where the payload lands (weights or scratch)
    spans: list[tuple[int, int]] = field(default_factory=list)
    waits: list[Pending] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)
    payload_crc: int = 0
    trailer: torch.Tensor | None = None
    trailer_wait: Pending | None = None


@dataclass
class RoundResult:
    """What one round did on this rank: per-piece statuses and the bytes it saw."""

    statuses: dict[int, Status]
    version: int
    slow_link_bytes: int = 0
    full_pieces: int = 0
    delta_pieces: int = 0
    touched: bool = False  # the weight buffer was written (a failure now tears it)
    marks_s: dict[str, float] = field(default_factory=dict)  # seconds since the round began


class RoundReceiver:
    """Runs rounds of the rollout side for one rank; scratch buffers live across syncs."""

    def __init__(self, t: Transport, layout: ShardLayout, peers: list[int], job: int,
                 job_id: str, ledger: VersionLedger, chunk_nbytes: int,
                 verify_relay: bool) -> None:
        self.t, self.layout, self.peers = t, layout, peers
        self.job, self.job_id, self.ledger = job, job_id, ledger
        self.chunk_nbytes, self.verify_relay = chunk_nbytes, verify_relay
        self._scratch: dict[int, torch.Tensor] = {}

    def run(self, flat: torch.Tensor, todo: list[StreamPiece], rnd: int, final: bool
            ) -> RoundResult:
        """Take in ``todo`` (own pieces from trainers, the rest relayed by their owners);
        reply to the trainers of own pieces (``final``: a retry request becomes FAILED)."""
        me, t0 = self.t.rank, time.perf_counter()
        intakes = [self._post_head(p, rnd) for p in todo]
        own = [i for i in intakes if not i.relay]
        others = [i for i in intakes if i.relay]
        sends: list[Pending] = []
        result = RoundResult({}, -1)
        for it in own + others:
            it.head_wait.wait()
            if not it.relay:
                sends += self._relay(it.head_buf, it.piece.piece, Slot.HEAD, rnd)
            self._open(flat, it, rnd, result)
        result.marks_s["headers_s"] = time.perf_counter() - t0
        self._pump(own, others, rnd, sends, result, t0)
        result.marks_s["chunks_s"] = time.perf_counter() - t0
        for it in own + others:
            if it.trailer_wait is not None and it.trailer is not None:
                it.trailer_wait.wait()
                if not it.relay:
                    sends += self._relay(it.trailer, it.piece.piece, Slot.TRAILER, rnd)
            self._finish(flat, it, result)
            result.statuses[it.piece.piece] = it.status
            if it.status is not Status.OK:
                log.warning("rank %d: piece %d from rank %d: %s", me, it.piece.piece, it.src,
                            it.status.name)
        for it in own:
            st = it.status
            if final and st in (Status.RESEND, Status.NEED_FULL):
                st = Status.FAILED
            code = torch.tensor([int(st)], dtype=torch.int64, device=self.t.device)
            sends.append(self.t.isend(code, it.src, tag(it.piece.piece, Slot.STATUS, rnd, False)))
        result.marks_s["verified_s"] = time.perf_counter() - t0
        for w in sends:
            w.wait()
        result.marks_s["relayed_s"] = time.perf_counter() - t0
        return result

    # ------------------------------------------------------------------ steps
    def _post_head(self, p: StreamPiece, rnd: int) -> _Intake:
        relay = p.dst != self.t.rank
        src = p.dst if relay else p.src
        buf = empty_header(self.t.device)
        return _Intake(p, src, relay, buf, self.t.irecv(buf, src, tag(p.piece, Slot.HEAD, rnd,
                                                                          relay)))

    def _relay(self, buf: torch.Tensor, piece: int, slot: int, rnd: int) -> list[Pending]:
        return [self.t.isend(buf, peer, tag(piece, slot, rnd, True)) for peer in self.peers]

    def _judge(self, it: _Intake, head: PieceHeader) -> Status:
        if head.job != self.job or head.piece != it.piece.piece:
            return Status.WRONG_JOB
        if not self.ledger.is_fresh(self.job_id, head.version):
            return Status.STALE
        if head.mode is SyncMode.DELTA and head.base_version != self.ledger.applied(self.job_id):
            return Status.NEED_FULL
        if head.mode is SyncMode.FULL and head.payload_nbytes != it.piece.nbytes:
            return Status.RESEND
        return Status.OK

    def _open(self, flat: torch.Tensor, it: _Intake, rnd: int, result: RoundResult) -> None:
        """Parse the header, choose where the payload lands, post its receives."""
        head = PieceHeader.from_tensor(it.head_buf)
        it.head = head
        result.version = max(result.version, head.version)
        if not it.relay:
            result.slow_link_bytes += head.payload_nbytes
            result.full_pieces += head.mode is SyncMode.FULL
            result.delta_pieces += head.mode is SyncMode.DELTA
        it.status = self._judge(it, head)
        n = head.payload_nbytes
        if it.status is Status.OK and head.mode is SyncMode.FULL:
            it.dest = self._weights(flat, it.piece)
            result.touched = True
        else:
            it.dest = self._scratch_for(it.piece.piece, n)
        it.spans = chunk_spans(n, self.chunk_nbytes)
        p = it.piece
        it.waits = [self.t.irecv(it.dest[o:o + k], it.src, tag(p.piece, Slot.PAYLOAD + i, rnd,
                                                               it.relay))
                    for i, (o, k) in enumerate(it.spans)]
        it.trailer = torch.zeros(len(chunk_spans(p.nbytes, self.chunk_nbytes)), dtype=torch.int64,
                                 device=self.t.device)
        it.trailer_wait = self.t.irecv(it.trailer, it.src, tag(p.piece, Slot.TRAILER, rnd,
                                                               it.relay))

    def _pump(self, own: list[_Intake], others: list[_Intake], rnd: int,
              sends: list[Pending], result: RoundResult, t0: float) -> None:
        """Chunk by chunk across all pieces: wait, relay (own pieces), checksum."""
        depth = max((len(it.spans) for it in own + others), default=0)
        for k in range(depth):
            for it in own + others:
                if k >= len(it.spans) or it.dest is None:
                    continue
                it.waits[k].wait()
                o, n = it.spans[k]
                chunk = it.dest[o:o + n]
                if not it.relay:
                    sends += self._relay(chunk, it.piece.piece, Slot.PAYLOAD + k, rnd)
                self._absorb(it, chunk)
                if not it.relay and k == len(it.spans) - 1:
                    result.marks_s["own_chunks_s"] = time.perf_counter() - t0

    def _absorb(self, it: _Intake, chunk: torch.Tensor) -> None:
        if it.status is not Status.OK or it.head is None:
            return  # refused: bytes are drained, not checked
        if it.head.mode is SyncMode.DELTA:
            it.payload_crc = crc32_into(chunk, it.payload_crc)
        elif not it.relay or self.verify_relay:
            it.crcs.append(crc32_into(chunk))

    def _finish(self, flat: torch.Tensor, it: _Intake, result: RoundResult) -> None:
        """Check the trailer; apply a delta in place; set the piece's final status."""
        head, trailer = it.head, it.trailer
        if it.status is not Status.OK or head is None or trailer is None:
            return
        expect = [int(x) for x in trailer.tolist()]
        if head.mode is SyncMode.FULL:
            if it.crcs and it.crcs != expect:
                it.status = Status.RESEND
            return
        if it.payload_crc != head.payload_crc or it.dest is None:
            it.status = Status.RESEND
            return
        target = self._weights(flat, it.piece)
        result.touched = True
        try:
            apply_delta(target, it.dest[:head.payload_nbytes])
        except SyncError:
            it.status = Status.RESEND
            return
        if (not it.relay or self.verify_relay) and \
                [int(x) for x in chunk_crcs(target, self.chunk_nbytes).tolist()] != expect:
            it.status = Status.RESEND

    def _weights(self, flat: torch.Tensor, p: StreamPiece) -> torch.Tensor:
        start = p.shard * self.layout.shard_nbytes + p.offset
        return flat[start:start + p.nbytes]

    def _scratch_for(self, piece: int, nbytes: int) -> torch.Tensor:
        buf = self._scratch.get(piece)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.t.device)
            self._scratch[piece] = buf
        return buf
