"""Two-tier weight sync: one sharded copy over the slow link, then an all-gather.

Stage 1: every training rank sends its pieces of the rollout shards to their owners,
all streams in parallel (see :func:`plan_streams`). Each piece carries a
:class:`PieceHeader` (job, version, checksums, full/delta) and is answered with a
:class:`Status`; a corrupt piece, or a delta whose base the receiver does not hold, is
sent again once, in full. Stage 2: the rollout ranks agree on the outcome (one tiny
all-gather), then all-gather the shards over their fast fabric and check each shard's
checksum. A refusal or failure raises on the rollout ranks (and, for stage-1 refusals,
on the sending training ranks too); weights are never silently mixed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from weave_slurm.errors import VersionMismatch
from weave_slurm.sync.delta import apply_delta, encode_delta
from weave_slurm.sync.errors import ShardCorrupt, SyncError
from weave_slurm.sync.header import (
    NO_BASE,
    PieceHeader,
    Status,
    SyncMode,
    crc32,
    empty_header,
    job_hash,
)
from weave_slurm.sync.ledger import VersionLedger
from weave_slurm.sync.topology import Pool, ShardLayout, StreamPiece, SyncTopology, plan_streams
from weave_slurm.sync.transport import Transport

log = logging.getLogger(__name__)

ROUNDS = 2  # first attempt + one retry


@dataclass(frozen=True)
class SyncConfig:
    """Per-job sync settings."""

    job_id: str
    mode: SyncMode = SyncMode.FULL
    verify_gather: bool = True


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


def _tags(piece: int) -> tuple[int, int, int]:
    return 3 * piece, 3 * piece + 1, 3 * piece + 2


class TwoTierSync:
    """One rank's end of the two-tier sync of one job's weights."""

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
        self._sent: dict[int, tuple[int, torch.Tensor]] = {}  # piece -> (version, bytes)
        self._sends_done: dict[int, int] = {}
        self._piece_crc: dict[int, int] = {}

    # ---------------------------------------------------------------- sender
    def push(self, flat: torch.Tensor, version: int) -> SyncReport:
        """Training rank: send this rank's pieces of ``flat`` (weights at ``version``)."""
        if self.pool is not Pool.TRAIN:
            raise SyncError(f"push called on rank {self.t.rank}, a {self.pool.value!r} rank")
        start = time.perf_counter()
        report = SyncReport(version)
        mine = [p for p in self.plan if p.src == self.t.rank]
        todo, full_only, worst = mine, False, Status.OK
        for rnd in range(ROUNDS):
            statuses = self._send_round(flat, version, todo, full_only, report)
            retry = [p for p in todo if statuses[p.piece] in (Status.RESEND, Status.NEED_FULL)]
            for p in todo:
                st = statuses[p.piece]
                if st is Status.OK:
                    continue
                if st not in (Status.STALE, Status.WRONG_JOB):  # refusals change nothing
                    self._sent.pop(p.piece, None)
                if not (rnd + 1 < ROUNDS and p in retry):
                    worst = max(worst, st if st is not Status.RESEND else Status.FAILED)
            if not retry or rnd + 1 == ROUNDS:
                break
            report.retries += len(retry)
            todo, full_only = retry, True
        report.elapsed_s = time.perf_counter() - start
        _raise_for(worst, self.config.job_id, version, f"rank {self.t.rank} push")
        return report

    def _payload(self, flat: torch.Tensor, version: int, p: StreamPiece, full_only: bool,
                 report: SyncReport) -> tuple[PieceHeader, torch.Tensor, torch.Tensor]:
        new = _piece_bytes(flat, self.layout, p)
        mode, base, payload = SyncMode.FULL, NO_BASE, new
        prev = self._sent.get(p.piece)
        if self.config.mode is SyncMode.DELTA and prev is not None and not full_only:
            encoded = encode_delta(prev[1], new, self.word_bytes)
            if encoded is not None:
                mode, base, payload = SyncMode.DELTA, prev[0], encoded[0]
        piece_crc = crc32(new)
        payload_crc = piece_crc if mode is SyncMode.FULL else crc32(payload)
        report.full_pieces += mode is SyncMode.FULL
        report.delta_pieces += mode is SyncMode.DELTA
        head = PieceHeader(self._job, version, base, p.piece, mode, payload.numel(),
                           payload_crc, piece_crc)
        return head, payload, new

    def _send_round(self, flat: torch.Tensor, version: int, todo: list[StreamPiece],
                    full_only: bool, report: SyncReport) -> dict[int, Status]:
        pending, replies, kept = [], {}, {}
        for p in todo:
            head, payload, new = self._payload(flat, version, p, full_only, report)
            n_done = self._sends_done.get(p.piece, 0)
            self._sends_done[p.piece] = n_done + 1
            if n_done < self.fault.corrupt_attempts and payload.numel():
                payload = payload.clone()
                payload[payload.numel() // 2] ^= 0x5A
            h_tag, p_tag, s_tag = _tags(p.piece)
            pending.append(self.t.isend(head.to_tensor(self.t.device), p.dst, h_tag))
            pending.append(self.t.isend(payload, p.dst, p_tag))
            replies[p.piece] = torch.zeros(1, dtype=torch.int64, device=self.t.device)
            pending.append(self.t.irecv(replies[p.piece], p.dst, s_tag))
            report.slow_link_bytes += payload.numel()
            kept[p.piece] = new
        for w in pending:
            w.wait()
        statuses = {k: Status(int(v.item())) for k, v in replies.items()}
        if self.config.mode is SyncMode.DELTA:
            for piece, st in statuses.items():
                if st is Status.OK:
                    self._sent[piece] = (version, kept[piece].clone())
        return statuses

    # -------------------------------------------------------------- receiver
    def receive(self, flat: torch.Tensor) -> SyncReport:
        """Rollout rank: receive the next version into ``flat`` (``layout.padded_nbytes``
        bytes, the rank's current weights); returns after the all-gather."""
        if self.pool is not Pool.ROLLOUT:
            raise SyncError(f"receive called on rank {self.t.rank}, a {self.pool.value!r} rank")
        if flat.numel() < self.layout.padded_nbytes:
            raise SyncError(f"receive buffer has {flat.numel()} B, needs "
                            f"{self.layout.padded_nbytes} (layout.padded_nbytes)")
        start = time.perf_counter()
        mine = [p for p in self.plan if p.dst == self.t.rank]
        staged, version, worst, report = self._receive_stage1(flat, mine)
        report.stages_s["slow_link_s"] = time.perf_counter() - start
        shard, crcs = self._agree(version, worst, staged, mine)
        t_gather = time.perf_counter()
        self._gather(flat, shard, crcs, report.version)
        report.stages_s["gather_s"] = time.perf_counter() - t_gather
        report.elapsed_s = time.perf_counter() - start
        return report

    def _receive_stage1(self, flat: torch.Tensor, mine: list[StreamPiece]
                        ) -> tuple[dict[int, torch.Tensor], int, Status, SyncReport]:
        staged: dict[int, torch.Tensor] = {}
        todo, version, worst = mine, -1, Status.OK
        report = SyncReport(version)
        for rnd in range(ROUNDS):
            results = self._receive_round(flat, todo, report)
            retry = []
            for p in todo:
                head, st, data = results[p.piece]
                version = max(version, head.version)
                if st is Status.OK:
                    staged[p.piece] = data
                    self._piece_crc[p.piece] = head.piece_crc
                elif st in (Status.RESEND, Status.NEED_FULL) and rnd + 1 < ROUNDS:
                    retry.append(p)
                else:
                    worst = max(worst, Status.FAILED if st is Status.RESEND else st)
            if rnd + 1 < ROUNDS:
                # tell each sender its piece's status (RESEND/NEED_FULL mean "again")
                self._reply(results, todo, final=False)
            else:
                self._reply(results, todo, final=True)
            if not retry:
                break
            report.retries += len(retry)
            todo = retry
        report.version = version
        return staged, version, worst, report

    def _reply(self, results: dict[int, tuple[PieceHeader, Status, torch.Tensor]],
               todo: list[StreamPiece], final: bool) -> None:
        pending = []
        for p in todo:
            st = results[p.piece][1]
            if final and st in (Status.RESEND, Status.NEED_FULL):
                st = Status.FAILED
            code = torch.tensor([int(st)], dtype=torch.int64, device=self.t.device)
            pending.append(self.t.isend(code, p.src, _tags(p.piece)[2]))
        for w in pending:
            w.wait()

    def _receive_round(self, flat: torch.Tensor, todo: list[StreamPiece], report: SyncReport
                       ) -> dict[int, tuple[PieceHeader, Status, torch.Tensor]]:
        heads = {p.piece: empty_header(self.t.device) for p in todo}
        waits = [self.t.irecv(heads[p.piece], p.src, _tags(p.piece)[0]) for p in todo]
        for w in waits:
            w.wait()
        parsed = {k: PieceHeader.from_tensor(v) for k, v in heads.items()}
        payloads, waits = {}, []
        for p in todo:
            payloads[p.piece] = torch.empty(parsed[p.piece].payload_nbytes, dtype=torch.uint8,
                                            device=self.t.device)
            waits.append(self.t.irecv(payloads[p.piece], p.src, _tags(p.piece)[1]))
        for w in waits:
            w.wait()
        out = {}
        for p in todo:
            head = parsed[p.piece]
            report.slow_link_bytes += head.payload_nbytes
            report.full_pieces += head.mode is SyncMode.FULL
            report.delta_pieces += head.mode is SyncMode.DELTA
            st, data = self._judge(flat, p, head, payloads[p.piece])
            if st is not Status.OK:
                log.warning("rank %d: piece %d of version %d from rank %d: %s", self.t.rank,
                            p.piece, head.version, p.src, st.name)
            out[p.piece] = (head, st, data)
        return out

    def _judge(self, flat: torch.Tensor, p: StreamPiece, head: PieceHeader,
               payload: torch.Tensor) -> tuple[Status, torch.Tensor]:
        job = self.config.job_id
        if head.job != self._job or head.piece != p.piece:
            return Status.WRONG_JOB, payload
        if not self.ledger.is_fresh(job, head.version):
            return Status.STALE, payload
        if crc32(payload) != head.payload_crc:
            return Status.RESEND, payload
        if head.mode is SyncMode.FULL:
            data = payload
        else:
            if head.base_version != self.ledger.applied(job):
                return Status.NEED_FULL, payload
            data = _piece_bytes(flat, self.layout, p).clone()
            try:
                apply_delta(data, payload)
            except SyncError:
                return Status.RESEND, payload
        if data.numel() != p.nbytes:
            return Status.RESEND, payload
        if head.mode is SyncMode.DELTA and crc32(data) != head.piece_crc:
            return Status.RESEND, payload  # (a full piece's payload crc is its piece crc)
        if head.mode is SyncMode.FULL and head.payload_crc != head.piece_crc:
            return Status.RESEND, payload
        return Status.OK, data

    def _agree(self, version: int, worst: Status, staged: dict[int, torch.Tensor],
               mine: list[StreamPiece]) -> tuple[torch.Tensor, list[int]]:
        """All rollout ranks learn every rank's stage-1 outcome; any failure fails all."""
        shard = (staged[mine[0].piece] if len(mine) == 1 and worst is Status.OK
                 else torch.cat([staged[p.piece] for p in mine]) if worst is Status.OK
                 else torch.empty(0, dtype=torch.uint8, device=self.t.device))
        crc = 0
        if worst is Status.OK:  # one piece per shard: its verified crc is the shard's
            crc = self._piece_crc[mine[0].piece] if len(mine) == 1 else crc32(shard)
        n = len(self.topology.rollout_ranks)
        mine_t = torch.tensor([int(worst), version, crc], dtype=torch.int64,
                              device=self.t.device)
        rows = [torch.empty(3, dtype=torch.int64, device=self.t.device) for _ in range(n)]
        self.t.all_gather(rows, mine_t, Pool.ROLLOUT)
        table = [tuple(int(x) for x in r.tolist()) for r in rows]
        worst_all = Status(max(row[0] for row in table))
        versions = {row[1] for row in table}
        if worst_all is Status.OK and len(versions) > 1:
            raise VersionMismatch(f"job {self.config.job_id!r}: rollout ranks received "
                                  f"different weight versions {sorted(versions)}; refused")
        _raise_for(worst_all, self.config.job_id, version, f"rank {self.t.rank} receive")
        return shard, [row[2] for row in table]

    def _gather(self, flat: torch.Tensor, shard: torch.Tensor, crcs: list[int],
                version: int) -> None:
        size = self.layout.shard_nbytes
        views = [flat[i * size:(i + 1) * size] for i in range(self.layout.n_shards)]
        job = self.config.job_id
        try:
            self.t.all_gather(views, shard, Pool.ROLLOUT)
        except SyncError:
            self.ledger.invalidate(job)
            raise
        if self.config.verify_gather:
            own = self.topology.rollout_ranks.index(self.t.rank)
            bad = [i for i, v in enumerate(views) if i != own and crc32(v) != crcs[i]]
            if bad:
                self.ledger.invalidate(job)
                raise ShardCorrupt(f"job {job!r} version {version}: shards {bad} failed their "
                                   "checksum after the rollout-pool all-gather")
        self.ledger.commit(job, version)


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
                           "checksum twice (first attempt and one retry)")
    raise SyncError(f"{where}: job {job!r} version {version}: sync failed ({status.name})")
