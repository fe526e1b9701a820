"""Bounded-staleness members in the group runtime: weight buffers and the version log.

A member with window ``k >= 1`` (``MemberSpec.staleness``) overlaps its own rollout
and training: the rollout of step ``m`` uses **exactly** the weights of version
``max(0, m - k)`` (:func:`~weave_slurm.runtime.ordering.rollout_version`), so it may
start as soon as that version is on its rollout node, without waiting for training
step ``m - 1``; training step ``v`` (held version ``v``) consumes the batch of step
``v``, so every batch's version ``b`` satisfies ``v - k <= b <= v``.

Weights travel into a ring of ``k + 1`` buffers per node (two for ``k = 1``: double
buffering), version ``v`` into buffer ``v % (k + 1)``. The executor writes the next
version into a buffer no rollout is reading (the ring argument: when version ``v``
exists, training ``v - 1`` has consumed the batch of the only rollout that used
version ``v - 1 - k``), each write replaces the segment file atomically (tmp file,
rename, index last) with the source's CRC32 in its index, and the executor checks the
written bytes against it before it *commits* the buffer (the flip: only then does a
rollout get pointed at it, by buffer name and version). The rollout phase checks the
version and the CRC32 again before it installs the weights. A half-written version is
never installed.

Every batch is recorded (:class:`BatchRecord`): its step, the weights version it was
generated with, the newest version that existed when its rollout started, and the
training step that consumed it. :class:`VersionLog` keeps them per member and rewrites
``<records_dir>/<job>.versions.jsonl`` after every change.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from weave_slurm.errors import StateError
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op

log = logging.getLogger(__name__)

WEIGHTS_BUFFER = "weights.b"    # + slot: the ring of weight buffers (k >= 1)
TRAJ_BUFFER = "traj.b"          # + slot: the ring of trajectory batches (k >= 1)
CRC_KEY = "crc32"


def buffer_name(prefix: str, index: int, staleness: int) -> str:
    """The ring buffer holding weights version / batch step ``index`` (k >= 1)."""
    return f"{prefix}{index % (staleness + 1)}"


def storage_crc32(storage: Any) -> int:
    """CRC32 of a mapped segment's bytes (a ``torch.UntypedStorage``)."""
    import torch

    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return zlib.crc32(data.data) & 0xFFFFFFFF


def copy_as(clients: Callable[[Path], Any], src: Path, src_name: str,
            dsts: Sequence[Path], job: JobRef, dst_name: str) -> tuple[int, int]:
    """Copy segment ``src_name`` of node ``src`` as ``dst_name`` onto ``dsts``, checked.

    Each destination gets the bytes with the source's CRC32 in its index; the
    written segment is read back and compared before this returns. Returns
    ``(version, bytes moved)``; ``StateError`` on a missing source or a bad copy.
    """
    from weave_slurm.node.segments import SegmentStore

    info = clients(src).call(Op.ATTACH_INFO, job=job.job_id)
    if src_name not in info["segments"]:
        raise StateError(f"job {job.job_id}: node {src} has no segment {src_name!r} "
                         f"(has {sorted(info['segments'])})")
    attached = SegmentStore(Path(info["root"])).attach_state(job, src_name)
    crc = storage_crc32(attached.storage)
    version = attached.index.version
    moved = 0
    for dst in dsts:
        client = clients(dst)
        client.put_state(job, dst_name, attached.tensors, version,
                         {**attached.index.extra, CRC_KEY: crc})
        dst_info = client.call(Op.ATTACH_INFO, job=job.job_id)
        written = SegmentStore(Path(dst_info["root"])).attach_state(job, dst_name)
        if written.index.version != version or storage_crc32(written.storage) != crc:
            raise StateError(f"job {job.job_id}: copy of {src_name} v{version} to {dst} as "
                             f"{dst_name} does not match its source (CRC32 {crc:#010x})")
        moved += attached.index.size_bytes
    return version, moved


@dataclass(frozen=True)
class BatchRecord:
    """One trajectory batch of a member, from its rollout to the training that used it."""

    step: int                      # the rollout step m (= the training step meant to use it)
    weights_version: int           # the version it was generated with: max(0, m - k)
    newest_version: int            # the newest version trained when its rollout started
    consumed_at: int | None = None  # the held version v of the training that consumed it

    def in_window(self, staleness: int) -> bool:
        """``v - k <= b <= v`` and ``b`` no newer than existed at rollout start."""
        if self.consumed_at is None:
            return self.weights_version <= self.newest_version
        return (self.consumed_at - staleness <= self.weights_version <= self.consumed_at
                and self.weights_version <= self.newest_version)


class VersionLog:
    """The trajectory-version log of one member (persisted when ``path`` is set)."""

    def __init__(self, job_id: str, staleness: int, path: Path | None = None) -> None:
        self.job_id = job_id
        self.staleness = staleness
        self.path = path
        self.records: list[BatchRecord] = []

    def produced(self, step: int, weights_version: int, newest_version: int) -> None:
        self.records = [r for r in self.records if r.step < step]
        self.records.append(BatchRecord(step, weights_version, newest_version))
        self._save()

    def consumed(self, step: int, at_version: int) -> BatchRecord:
        for i, rec in enumerate(self.records):
            if rec.step == step and rec.consumed_at is None:
                done = replace(rec, consumed_at=at_version)
                if not done.in_window(self.staleness):
                    raise StateError(f"member {self.job_id}: batch of step {step} from "
                                     f"weights v{rec.weights_version} trained at "
                                     f"v{at_version}: outside the window k={self.staleness}")
                self.records[i] = done
                self._save()
                return done
        raise StateError(f"member {self.job_id}: no unconsumed batch of step {step} in its "
                         f"version log (steps {[r.step for r in self.records]})")

    def rewind(self, version: int) -> None:
        """A restore to ``version``: batches of later steps are replayed."""
        self.records = [r for r in self.records if r.step < version]
        self._save()

    def current_staleness(self) -> int | None:
        """Version lag of the last consumed batch (None before the first)."""
        lags = [r.consumed_at - r.weights_version for r in self.records
                if r.consumed_at is not None]
        return lags[-1] if lags else None

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = [json.dumps({"job": self.job_id, "staleness": self.staleness, **asdict(r)})
                 for r in self.records]
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.path)

    @staticmethod
    def load(path: Path) -> list[BatchRecord]:
        """Read a persisted log back (tests, tools)."""
        out = []
        for line in path.read_text().splitlines():
            raw = json.loads(line)
            out.append(BatchRecord(int(raw["step"]), int(raw["weights_version"]),
                                   int(raw["newest_version"]), raw["consumed_at"]))
        return out
