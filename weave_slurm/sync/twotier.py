"""Two-tier weight sync: one sharded copy over the slow link, relayed inside the rollout pool.

Stage 1: every training rank sends its pieces of the rollout shards to their owners,
all streams in parallel (see :func:`plan_streams`), each piece as a
:class:`PieceHeader`, payload chunks and a trailer of chunk checksums that the sender
computes while the chunks are in flight (:mod:`~weave_slurm.sync.pieces`). Stage 2: the
owner relays every chunk to the other rollout ranks as soon as it has it, so the fast
intra-pool transfer hides behind the slow link (:mod:`~weave_slurm.sync.receiver`).
Each piece is answered with a :class:`Status`; a corrupt piece, or a delta whose base
the receiver does not hold, is sent again once, in full. The rollout ranks then agree
(one tiny all-gather per round): a version is committed only when every rank holds
every piece intact; otherwise every rollout rank raises and, if its weights were
written, marks them torn so the next sync is full. Weights are never silently mixed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from weave_slurm.errors import VersionMismatch
from weave_slurm.sync.delta import encode_delta
from weave_slurm.sync.header import NO_BASE, PieceHeader, Status, SyncMode, job_hash
from weave_slurm.sync.pieces import Slot, chunk_crcs, chunk_spans, crc32_into, tag
from weave_slurm.sync.receiver import RoundReceiver, RoundResult
from weave_slurm.sync.sync_errors import ShardCorrupt, SyncError
from weave_slurm.sync.topology import ShardLayout, StreamPiece, SyncTopology, plan_streams
from weave_slurm.sync.transport import Pending, Transport
from weave_slurm.sync.version_ledger import VersionLedger
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

ROUNDS = 2  # first attempt + one retry
DEFAULT_CHUNK_NBYTES = 2 << 20


@dataclass(frozen=True)
class SyncConfig:
    """Per-job sync settings (identical on every rank of the group).

    ``chunk_nbytes``: payload chunk size (a multiple of 64); smaller chunks shorten the
    pipeline's tail, larger ones cost fewer messages. ``verify_gather``: rollout ranks
    also checksum the chunks relayed to them (their own pieces are always checked).
    """

    job_id: str
    mode: SyncMode = SyncMode.FULL
    verify_gather: bool = True
    chunk_nbytes: int = DEFAULT_CHUNK_NBYTES


@dataclass(frozen=True)
class FaultPlan:
    """Test hook: flip one payload byte in the first ``corrupt_attempts`` sends of a piece."""

    corrupt_attempts: int = 0


@dataclass
class SyncReport:
    """What one push or receive did on this rank."""

    version: int
    slow_link_bytes: int = 0
    full_pieces: int = 0
    delta_pieces: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    stages_s: dict[str, float] = field(default_factory=dict)


class TwoTierSync:
    """One rank's end of the two-tier sync of one job's weights.

    Buffers that outlive a sync (the sender's delta bases, the receiver's scratch space)
    are allocated once and reused, so steady-state syncs never touch fresh memory.
    """

    def __init__(self, transport: Transport, topology: SyncTopology, layout: ShardLayout,
                 word_bytes: int, config: SyncConfig, ledger: VersionLedger | None = None,
                 fault: FaultPlan | None = None) -> None:
        self.t, self.topology, self.layout = transport, topology, layout
        self.word_bytes, self.config = word_bytes, config
        self.ledger = ledger if ledger is not None else VersionLedger()
        self.fault = fault or FaultPlan()
        self.plan = plan_streams(topology, layout)
        self.pool = topology.info(transport.rank).pool
        self._job = job_hash(config.job_id)
        self._base_version: dict[int, int] = {}  # piece -> version its delta base holds
        self._base: dict[int, torch.Tensor] = {}  # piece -> bytes last delivered (reused)
        self._sends_done: dict[int, int] = {}
        chunk_spans(ShardLayout(64, 1).shard_nbytes, config.chunk_nbytes)  # validates
        peers = [r for r in topology.rollout_ranks if r != transport.rank]
        self._rx = RoundReceiver(transport, layout, peers, self._job, config.job_id,
                                 self.ledger, config.chunk_nbytes, config.verify_gather)

    # ---------------------------------------------------------------- sender
    def push(self, flat: torch.Tensor, version: int) -> SyncReport:
        """Training rank: send this rank's pieces of ``flat`` (weights at ``version``;
        ``layout.padded_nbytes`` bytes avoid a padding copy for the last shard)."""
        if self.pool is not Pool.TRAIN:
            raise SyncError(f"push called on rank {self.t.rank}, a {self.pool.value!r} rank")
        start = time.perf_counter()
        report = SyncReport(version)
        todo = [p for p in self.plan if p.src == self.t.rank]
        full_only, worst = False, Status.OK
        for rnd in range(ROUNDS):
            statuses = self._send_round(flat, version, todo, full_only, rnd, report)
            last = rnd + 1 == ROUNDS
            retry = [p for p in todo if statuses[p.piece] in (Status.RESEND, Status.NEED_FULL)
                     and not last]
            for p in todo:
                st = statuses[p.piece]
                if st is Status.OK or p in retry:
                    continue
                if st not in (Status.STALE, Status.WRONG_JOB):  # refusals keep the base
                    self._base_version.pop(p.piece, None)
                worst = max(worst, Status.FAILED if st is Status.RESEND else st)
            if not retry:
                break
            report.retries += len(retry)
            todo, full_only = retry, True
        report.elapsed_s = time.perf_counter() - start
        _raise_for(worst, self.config.job_id, version, f"rank {self.t.rank} push")
        return report

    def _payload(self, flat: torch.Tensor, version: int, p: StreamPiece, full_only: bool,
                 report: SyncReport) -> tuple[PieceHeader, torch.Tensor, torch.Tensor]:
        new = _piece_bytes(flat, self.layout, p)
        mode, base, payload, payload_crc = SyncMode.FULL, NO_BASE, new, 0
        if (self.config.mode is SyncMode.DELTA and not full_only
                and p.piece in self._base_version):
            encoded = encode_delta(self._base[p.piece], new, self.word_bytes)
            if encoded is not None:
                mode, base, payload = SyncMode.DELTA, self._base_version[p.piece], encoded[0]
                payload_crc = crc32_into(payload)
        report.full_pieces += mode is SyncMode.FULL
        report.delta_pieces += mode is SyncMode.DELTA
        head = PieceHeader(self._job, version, base, p.piece, mode, payload.numel(),
                           payload_crc, 0)
        return head, payload, new

    def _send_round(self, flat: torch.Tensor, version: int, todo: list[StreamPiece],
                    full_only: bool, rnd: int, report: SyncReport) -> dict[int, Status]:
        pending: list[Pending] = []
        replies: dict[int, torch.Tensor] = {}
        kept: list[tuple[StreamPiece, torch.Tensor]] = []
        for p in todo:
            head, payload, new = self._payload(flat, version, p, full_only, report)
            n_done = self._sends_done.get(p.piece, 0)
            self._sends_done[p.piece] = n_done + 1
            if n_done < self.fault.corrupt_attempts and payload.numel():
                payload = payload.clone()
                payload[payload.numel() // 2] ^= 0x5A
            pending.append(self.t.isend(head.to_tensor(self.t.device), p.dst,
                                        tag(p.piece, Slot.HEAD, rnd, False)))
            for i, (o, n) in enumerate(chunk_spans(payload.numel(), self.config.chunk_nbytes)):
                pending.append(self.t.isend(payload[o:o + n], p.dst,
                                            tag(p.piece, Slot.PAYLOAD + i, rnd, False)))
            replies[p.piece] = torch.zeros(1, dtype=torch.int64, device=self.t.device)
            pending.append(self.t.irecv(replies[p.piece], p.dst,
                                        tag(p.piece, Slot.STATUS, rnd, False)))
            report.slow_link_bytes += payload.numel()
            kept.append((p, new))
        trailers = []
        for p, new in kept:  # checksums while the chunks are on the wire
            trailers.append(chunk_crcs(new, self.config.chunk_nbytes).to(self.t.device))
            pending.append(self.t.isend(trailers[-1], p.dst,
                                        tag(p.piece, Slot.TRAILER, rnd, False)))
        for w in pending:
            w.wait()
        statuses = {k: Status(int(v.item())) for k, v in replies.items()}
        if self.config.mode is SyncMode.DELTA:
            for p, new in kept:
                if statuses[p.piece] is Status.OK:
                    self._keep_base(p.piece, version, new)
        return statuses

    def _keep_base(self, piece: int, version: int, new: torch.Tensor) -> None:
        buf = self._base.get(piece)
        if buf is None or buf.numel() != new.numel():
            buf = torch.empty_like(new)
            self._base[piece] = buf
        buf.copy_(new)
        self._base_version[piece] = version

    # -------------------------------------------------------------- receiver
    def receive(self, flat: torch.Tensor) -> SyncReport:
        """Rollout rank: receive the next version into ``flat`` (``layout.padded_nbytes``
        bytes, the rank's current weights); returns once every rollout rank has it."""
        if self.pool is not Pool.ROLLOUT:
            raise SyncError(f"receive called on rank {self.t.rank}, a {self.pool.value!r} rank")
        if flat.numel() < self.layout.padded_nbytes:
            raise SyncError(f"receive buffer has {flat.numel()} B, needs "
                            f"{self.layout.padded_nbytes} (layout.padded_nbytes)")
        try:
            return self._receive(flat)
        except SyncError:
            self.ledger.invalidate(self.config.job_id)  # weights may be half-written
            raise

    def _receive(self, flat: torch.Tensor) -> SyncReport:
        start = time.perf_counter()
        report = SyncReport(-1)
        todo, final, touched = list(self.plan), dict[int, Status](), False
        version = -1
        for rnd in range(ROUNDS):
            last = rnd + 1 == ROUNDS
            res = self._rx.run(flat, todo, rnd, final=last)
            report.stages_s.update({f"round{rnd}_{k}": v for k, v in res.marks_s.items()})
            report.stages_s[f"round{rnd}_agreed_s"] = time.perf_counter() - start
            report.slow_link_bytes += res.slow_link_bytes
            report.full_pieces += res.full_pieces
            report.delta_pieces += res.delta_pieces
            touched |= res.touched
            table = self._share(res, todo)
            version = max(row[0] for row in table)
            retry = []
            for p in todo:
                owner = table[self.topology.rollout_ranks.index(p.dst)][2 + p.piece]
                if owner in (Status.RESEND, Status.NEED_FULL) and not last:
                    retry.append(p)
                    continue
                worst = max(Status(row[2 + p.piece]) for row in table)
                final[p.piece] = (Status.FAILED if worst in (Status.RESEND, Status.NEED_FULL)
                                  else worst)
            if not retry:
                break
            report.retries += len(retry)
            todo = retry
        report.version = version
        self._commit(final, {row[0] for row in table}, version, touched)
        report.elapsed_s = time.perf_counter() - start
        return report

    def _share(self, res: RoundResult, todo: list[StreamPiece]) -> list[list[int]]:
        """All-gather ``[version, 0, status of every piece]`` across the rollout pool."""
        row = [res.version, 0] + [0] * len(self.plan)
        for p in todo:
            row[2 + p.piece] = int(res.statuses[p.piece])
        mine = torch.tensor(row, dtype=torch.int64, device=self.t.device)
        rows = [torch.empty_like(mine) for _ in self.topology.rollout_ranks]
        self.t.all_gather(rows, mine, Pool.ROLLOUT)
        return [[int(x) for x in r.tolist()] for r in rows]

    def _commit(self, final: dict[int, Status], versions: set[int], version: int,
                touched: bool) -> None:
        job = self.config.job_id
        worst = max(final.values(), default=Status.OK)
        if worst is Status.OK and len(versions) > 1:
            if touched:
                self.ledger.invalidate(job)
            raise VersionMismatch(f"job {job!r}: rollout ranks received different weight "
                                  f"versions {sorted(versions)}; refused")
        if worst is Status.OK:
            self.ledger.commit(job, version)
            return
        if touched:
            self.ledger.invalidate(job)
        _raise_for(worst, job, version, f"rank {self.t.rank} receive")


def _piece_bytes(flat: torch.Tensor, layout: ShardLayout, p: StreamPiece) -> torch.Tensor:
    start = p.shard * layout.shard_nbytes + p.offset
    end = start + p.nbytes
    if end <= flat.numel():
        return flat[start:end]
    out = torch.zeros(p.nbytes, dtype=torch.uint8, device=flat.device)
    if start < flat.numel():
        out[:flat.numel() - start] = flat[start:]
    return out


def _raise_for(status: Status, job: str, version: int, where: str) -> None:
    if status is Status.OK:
        return
    if status in (Status.STALE, Status.WRONG_JOB):
        raise VersionMismatch(f"{where}: job {job!r} weight version {version} refused by a "
                              f"rollout rank ({status.name}: stale, duplicate or wrong job)")
    if status is Status.FAILED:
        raise ShardCorrupt(f"{where}: job {job!r} version {version}: a piece failed its "
                           "checksum on the slow link twice (first attempt and one retry) "
                           "or in the rollout-pool relay")
    raise SyncError(f"{where}: job {job!r} version {version}: sync failed ({status.name})")
