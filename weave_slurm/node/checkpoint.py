"""Periodic on-disk checkpoints of a job's warm state, and restore into shared memory.

Layout under the checkpoint root (a local or shared file system, not tmpfs)::

    <ckpt_root>/<uid>/<job_id>/                 0700, owned by uid
        ckpt-000007/                            0700, one checkpoint
            MANIFEST.json                       0600: segments, versions, bytes, time
            <name>.seg  <name>.json             0600: raw segment bytes and index

A checkpoint is written into ``.tmp-ckpt-<seq>-<pid>`` and renamed into place, so a
crash never leaves a half checkpoint under a ``ckpt-*`` name; only the newest
``keep_last`` are kept. Restore copies the bytes straight into new segments.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedWriter
from pathlib import Path
from typing import TYPE_CHECKING

from weave_slurm.errors import ConfigError, NoCheckpoint, StateError
from weave_slurm.node.index import JobRef, SegmentIndex, is_scratch
from weave_slurm.node.segment_bytes import read_in
from weave_slurm.node.segments import SegmentStore, tensor_views

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
_CHUNK_BYTES = 64 << 20
PREFIX = "ckpt-"


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint on disk; ``elapsed_s`` is the time the save or restore took."""

    path: Path
    seq: int
    versions: dict[str, int]
    size_bytes: int
    elapsed_s: float

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "seq": self.seq, "versions": dict(self.versions),
                "size_bytes": self.size_bytes, "elapsed_s": self.elapsed_s}


class CheckpointStore:
    """Checkpoints of every job of a node, ``keep_last`` per job."""

    def __init__(self, root: Path, keep_last: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if keep_last < 1:
            raise ConfigError(f"keep_last {keep_last!r} must be >= 1")
        self.root = Path(root)
        self.keep_last = keep_last
        self._clock = clock

    def job_dir(self, job: JobRef) -> Path:
        return self.root / str(job.uid) / job.job_id

    def checkpoints(self, job: JobRef) -> list[Path]:
        """Complete checkpoints of ``job``, oldest first."""
        if not self.job_dir(job).is_dir():
            return []
        found = [p for p in self.job_dir(job).iterdir()
                 if p.name.startswith(PREFIX) and (p / MANIFEST).is_file()]
        return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)))

    def save(self, store: SegmentStore, job: JobRef) -> CheckpointInfo:
        """Checkpoint every complete segment of ``job``."""
        def fill(tmp: Path) -> tuple[dict[str, int], int, dict[str, str]]:
            versions: dict[str, int] = {}
            total = 0
            for seg in store.list_segments(job):
                if is_scratch(seg.name):      # a worker's switched-out device state
                    continue
                if seg.problem is not None:
                    log.warning("checkpoint of %s skips torn %s", job.job_id, seg.name)
                    continue
                with self._create(tmp / f"{seg.name}.seg", job.uid) as out:
                    index = store.copy_out(job, seg.name, out)
                    out.flush()
                    os.fsync(out.fileno())
                with self._create(tmp / f"{seg.name}.json", job.uid) as out:
                    out.write(index.dumps().encode())
                versions[seg.name] = index.version
                total += index.size_bytes
            return versions, total, {}
        return self._write_new(job, fill)

    def _write_new(self, job: JobRef, fill: Callable[[Path], tuple[dict[str, int], int,
                                                                  dict[str, str]]]
                   ) -> CheckpointInfo:
        """The job's next checkpoint: ``fill(tmp)`` writes the segments into a private
        temporary directory and returns (versions, bytes, more manifest fields); the
        manifest is written last and the directory renamed into place."""
        start = self._clock()
        jdir = self._ensure_dirs(job)
        existing = self.checkpoints(job)
        seq = int(existing[-1].name.removeprefix(PREFIX)) + 1 if existing else 1
        tmp = jdir / f".tmp-{PREFIX}{seq:06d}-{os.getpid()}"
        final = jdir / f"{PREFIX}{seq:06d}"
        try:
            self._mkdir(tmp, job.uid)
            versions, total, more = fill(tmp)
            with self._create(tmp / MANIFEST, job.uid) as out:
                out.write(json.dumps({"seq": seq, "versions": versions,
                                      "size_bytes": total, **more}).encode())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in self.checkpoints(job)[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return CheckpointInfo(final, seq, versions, total, self._clock() - start)

    def read(self, path: Path) -> CheckpointInfo:
        try:
            raw = json.loads((path / MANIFEST).read_text())
            return CheckpointInfo(path, int(raw["seq"]),
                                  {k: int(v) for k, v in raw["versions"].items()},
                                  int(raw["size_bytes"]), 0.0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"checkpoint manifest {path / MANIFEST} is unreadable: "
                             f"{exc}") from exc

    def indexes(self, path: Path) -> list[SegmentIndex]:
        """The segment indexes stored in checkpoint ``path``."""
        info = self.read(path)
        return [SegmentIndex.loads((path / f"{n}.json").read_text(), str(path / n))
                for n in sorted(info.versions)]

    def latest(self, job: JobRef, version: int | None = None) -> Path:
        """The newest checkpoint of ``job`` (with ``version``: the newest whose ``state``
        is of that version, e.g. a gang rank's of the version the gang committed)."""
        found = self.checkpoints(job)
        if version is not None:
            found = [p for p in found if self.read(p).versions.get("state") == version]
        if not found:
            at = "" if version is None else f" of state version {version}"
            raise NoCheckpoint(f"job {job.job_id!r} has no checkpoint{at} under "
                               f"{self.job_dir(job)}")
        return found[-1]

    def restore(self, store: SegmentStore, job: JobRef, path: Path | None = None,
                drop_cache: bool = False) -> CheckpointInfo:
        """Copy checkpoint ``path`` (default: the newest) into ``job``'s segments.

        ``drop_cache`` advises the kernel to forget the files' cached pages first, so the
        time measured is a cold read from the disk.
        """
        path = path or self.latest(job)
        start = self._clock()
        info = self.read(path)
        for index in self.indexes(path):
            src_path = path / f"{index.name}.seg"
            with open(src_path, "rb", buffering=0) as src:
                if drop_cache:
                    os.posix_fadvise(src.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                store.put_raw(job, index, src)
        return CheckpointInfo(path, info.seq, info.versions, info.size_bytes,
                              self._clock() - start)

    def delete_job(self, job: JobRef) -> None:
        shutil.rmtree(self.job_dir(job), ignore_errors=True)

    def adopt(self, src: CheckpointStore, job: JobRef) -> CheckpointInfo:
        """Take over ``job``'s newest checkpoint from another node's store ``src`` (a
        node that was lost, its checkpoint root on a shared file system): copied in as
        this store's newest checkpoint of the job, then removed there.

        Copy, not rename: a crash half way leaves the source whole for the next try, and
        the two roots need not be one file system.
        """
        newest = src.latest(job)
        info = src.read(newest)
        src.indexes(newest)   # every index it names is there and parses

        def fill(tmp: Path) -> tuple[dict[str, int], int, dict[str, str]]:
            for name in sorted(info.versions):
                for ext in (".seg", ".json"):
                    with open(newest / f"{name}{ext}", "rb") as fin, \
                            self._create(tmp / f"{name}{ext}", job.uid) as out:
                        shutil.copyfileobj(fin, out, _CHUNK_BYTES)
                        out.flush()
                        os.fsync(out.fileno())
            return dict(info.versions), info.size_bytes, {"adopted_from": str(newest)}
        adopted = self._write_new(job, fill)
        src.delete_job(job)
        return adopted

    # -- internals ---------------------------------------------------------------
    def _ensure_dirs(self, job: JobRef) -> Path:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        for d in (self.root / str(job.uid), self.job_dir(job)):
            if not d.is_dir():
                self._mkdir(d, job.uid)
        return self.job_dir(job)

    @staticmethod
    def _mkdir(path: Path, uid: int) -> None:
        path.mkdir(mode=0o700)
        if os.geteuid() == 0 and uid != 0:
            os.chown(path, uid, -1)

    @staticmethod
    def _create(path: Path, uid: int) -> BufferedWriter:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        if os.geteuid() == 0 and uid != 0:
            os.fchown(fd, uid, -1)
        return os.fdopen(fd, "wb")


def read_segment(path: Path, name: str) -> tuple[SegmentIndex, dict[str, torch.Tensor]]:
    """Load segment ``name`` of checkpoint ``path`` into private memory, for a process
    that starts cold (no node daemon, no shared memory): one read of the file."""
    where = path / f"{name}.json"
    try:
        index = SegmentIndex.loads(where.read_text(), str(where))
    except FileNotFoundError:
        have = sorted(p.stem for p in path.glob("*.json") if p.name != MANIFEST)
        raise StateError(f"checkpoint {path} has no segment {name!r} (has: "
                         f"{', '.join(have)})") from None
    index.validate(f"checkpoint {path}/{name}")
    import torch  # a cold reader makes tensors; the node daemon never calls this

    buf = torch.empty(index.size_bytes, dtype=torch.uint8)
    with open(path / f"{name}.seg", "rb", buffering=0) as src, \
            buf.numpy().data as view:
        read_in(src, view, f"checkpoint {path}/{name}.seg")
    return index, tensor_views(buf.untyped_storage(), index)
