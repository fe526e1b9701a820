"""The one door to shared memory: file-backed warm-state segments.

Layout under the root (default ``/dev/shm/weave``)::

    <root>/                      0711, the daemon's
    <root>/<uid>/                0700, owned by uid
    <root>/<uid>/<job_id>/       0700, owned by uid
        .lock                    0600, the job's cross-process lock
        <name>.seg               0600, raw bytes (fallocated, so tmpfs space is real)
        <name>.json              0600, the SegmentIndex, written after the data

Any process of the owning uid (or root) attaches a segment zero-copy with
``torch.UntypedStorage.from_file(path, shared=True, nbytes=n)``; writes through the
attached tensors are visible to every other attacher. Other uids cannot traverse the
job directory. We never use ``multiprocessing.shared_memory``: its resource tracker
unlinks segments when an attaching process exits.

torch is imported only where tensors are made. What the node daemon does (checkpoint,
restore, copy, CRC, digest) works on the bytes (:mod:`~weave_slurm.node.segment_bytes`),
so ``weave node serve`` never imports it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import pwd
import shutil
import stat
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from weave_slurm.errors import ConfigError, InsufficientResources, SegmentMissing, StateError
from weave_slurm.node.index import (
    DEFAULT_ALIGN_BYTES,
    DEFAULT_ROOT,
    JobRef,
    SegmentIndex,
    check_name,
    plan_layout,
)
from weave_slurm.node.segment_bytes import mapped, read_in, write_out

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SEG_SUFFIX = ".seg"
INDEX_SUFFIX = ".json"
TMP_MARK = ".tmp-"
STAGE_MARK = ".stage-"       # files the daemon staged for a client's put (``staging``)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gid_of(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


@dataclass(frozen=True)
class AttachedState:
    """Tensors viewing one mapped segment; they keep the mapping alive."""

    index: SegmentIndex
    tensors: dict[str, torch.Tensor]
    storage: torch.UntypedStorage


@dataclass(frozen=True)
class SegmentListing:
    """One segment found on disk; ``problem`` is None when its index is valid."""

    job: JobRef
    name: str
    seg_path: Path
    size_bytes: int
    index: SegmentIndex | None
    problem: str | None


class SegmentStore:
    """File-backed segments of every job on this node, under one root directory."""

    def __init__(self, root: Path = DEFAULT_ROOT, align_bytes: int = DEFAULT_ALIGN_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.align_bytes = align_bytes
        self._clock = clock

    # -- paths and directories -------------------------------------------------
    def job_dir(self, job: JobRef) -> Path:
        return self.root / str(job.uid) / job.job_id

    def seg_path(self, job: JobRef, name: str) -> Path:
        return self.job_dir(job) / f"{check_name('segment name', name)}{SEG_SUFFIX}"

    def index_path(self, job: JobRef, name: str) -> Path:
        return self.job_dir(job) / f"{check_name('segment name', name)}{INDEX_SUFFIX}"

    def ensure_job_dir(self, job: JobRef) -> Path:
        """Create (or check) the root, uid and job directories with their owners."""
        if os.geteuid() not in (0, job.uid):
            raise StateError(f"job {job.job_id!r} belongs to uid {job.uid}; uid "
                             f"{os.geteuid()} is not root and cannot hold its state")
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        for path in (self.root / str(job.uid), self.job_dir(job)):
            try:
                path.mkdir(mode=0o700)
                if os.geteuid() == 0 and job.uid != 0:
                    os.chown(path, job.uid, gid_of(job.uid), follow_symlinks=False)
            except FileExistsError:
                pass
            self._check_private_dir(path, job.uid)
        lock = self.job_dir(job) / ".lock"
        if not lock.exists():
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            self._own_fd(fd, job.uid)
            os.close(fd)
        return self.job_dir(job)

    def check_job_dir(self, job: JobRef) -> Path:
        """The job's directory, which must exist already (it is never created here)."""
        jdir = self.job_dir(job)
        try:
            self._check_private_dir(jdir, job.uid)
        except FileNotFoundError:
            raise StateError(f"job {job.job_id!r} has no state directory {jdir} on this "
                             "node (dropped?); register it again") from None
        return jdir

    @contextmanager
    def job_lock(self, job: JobRef, timeout_s: float = 60.0) -> Iterator[None]:
        """Serialise writers of one job's segments (across processes).

        flock on the job's existing ``.lock``: never creates it or its directory, so
        a writer that lost a race with ``drop`` cannot bring the job's directory back.
        """
        path = self.job_dir(job) / ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise StateError(f"job {job.job_id!r} has no state directory "
                             f"{self.job_dir(job)} on this node (dropped?)") from None
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StateError(f"{path}: held by another writer for more than "
                                         f"{timeout_s} s") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the flock

    # -- write -------------------------------------------------------------------
    def put_state(self, job: JobRef, name: str, tensors: Mapping[str, torch.Tensor],
                  version: int, extra: Mapping[str, Any] | None = None,
                  checksum: bool = False) -> SegmentIndex:
        """Write ``tensors`` as segment ``name`` of ``job`` (replacing any old one)."""
        specs = [(k, dtype_name(t.dtype), tuple(t.shape)) for k, t in tensors.items()]
        entries, size = plan_layout(specs, self.align_bytes)
        self.ensure_job_dir(job)
        seg = self.seg_path(job, name)
        tmp = seg.with_name(f"{seg.name}{TMP_MARK}{os.getpid()}")
        now = self._clock()
        index = SegmentIndex(name=name, version=version, size_bytes=size,
                             align_bytes=self.align_bytes, tensors=entries, created_s=now,
                             updated_s=now, extra=dict(extra or {}))
        with self.job_lock(job):
            try:
                self.allocate(tmp, size, job.uid)
                storage = map_file(tmp, size)
                views = tensor_views(storage, index)
                for key, src in tensors.items():
                    views[key].copy_(src.detach())
                if checksum:
                    index = replace(index, crc32=_crc32(storage))
                del views, storage
                # Old index first: between the renames the segment reads as torn.
                self.index_path(job, name).unlink(missing_ok=True)
                os.replace(tmp, seg)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._write_index(job, index)
        log.debug("put %s/%s v%d (%d B)", job.job_id, name, version, size)
        return index

    def update_state(self, job: JobRef, name: str, tensors: Mapping[str, torch.Tensor],
                     version: int, extra: Mapping[str, Any] | None = None) -> SegmentIndex:
        """Overwrite some or all tensors of an existing segment in place."""
        with self.job_lock(job):
            index = self.read_index(job, name)
            for key, src in tensors.items():
                e = index.entry(key)
                if tuple(src.shape) != e.shape or dtype_name(src.dtype) != e.dtype:
                    raise StateError(
                        f"update of {job.job_id}/{name}: tensor {key!r} is "
                        f"{dtype_name(src.dtype)}{list(src.shape)}, the segment holds "
                        f"{e.dtype}{list(e.shape)}; use put_state to change the layout")
            self._write_index(job, replace(index, complete=False))
            storage = self._map(job, name, index)
            views = tensor_views(storage, index)
            for key, src in tensors.items():
                views[key].copy_(src.detach())
            merged = {**index.extra, **(extra or {})}
            crc = _crc32(storage) if index.crc32 is not None else None
            new = replace(index, version=version, updated_s=self._clock(), complete=True,
                          crc32=crc, extra=merged)
            self._write_index(job, new)
        return new

    def put_raw(self, job: JobRef, index: SegmentIndex, src: BinaryIO) -> SegmentIndex:
        """Write a segment from raw bytes (a checkpoint file) with a known index."""
        index.validate(f"restore of {job.job_id}/{index.name}")
        self.ensure_job_dir(job)
        with self.job_lock(job):
            return self._put_raw_locked(job, index, src)

    def _put_raw_locked(self, job: JobRef, index: SegmentIndex, src: BinaryIO
                        ) -> SegmentIndex:
        seg = self.seg_path(job, index.name)
        tmp = seg.with_name(f"{seg.name}{TMP_MARK}{os.getpid()}")
        try:
            self.allocate(tmp, index.size_bytes, job.uid)
            with mapped(tmp, index.size_bytes, write=True) as view:
                read_in(src, view, f"restore of {job.job_id}/{index.name}")
            self.index_path(job, index.name).unlink(missing_ok=True)
            os.replace(tmp, seg)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        index = replace(index, complete=True)
        self._write_index(job, index)
        return index

    def copy_out(self, job: JobRef, name: str, dst: BinaryIO) -> SegmentIndex:
        """Write a consistent copy of a segment's bytes to ``dst``; returns its index."""
        with self.job_lock(job):
            index = self.read_index(job, name)
            if not index.complete:
                raise StateError(f"segment {job.job_id}/{name} is torn; not copied")
            with mapped(self._checked(job, name, index), index.size_bytes) as view:
                write_out(view, dst)
        return index

    def copy_segment(self, job: JobRef, name: str, as_name: str,
                     extra: Mapping[str, Any]) -> SegmentIndex:
        """Segment ``name``'s bytes and layout as segment ``as_name`` (replacing any old
        one), its index's ``extra`` updated with ``extra``."""
        with self.job_lock(job):
            index = self.read_index(job, name)
            if not index.complete:
                raise StateError(f"segment {job.job_id}/{name} is torn; not copied")
            with open(self._checked(job, name, index), "rb") as src:
                now = self._clock()
                copy = replace(index, name=as_name, created_s=now, updated_s=now, crc32=None,
                               extra={**index.extra, **extra})
                return self._put_raw_locked(job, copy, src)

    # -- read --------------------------------------------------------------------
    def read_index(self, job: JobRef, name: str) -> SegmentIndex:
        path = self.index_path(job, name)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise SegmentMissing(f"job {job.job_id!r} has no segment {name!r} "
                                 f"(no index at {path})") from None
        return SegmentIndex.loads(text, str(path))

    @contextmanager
    def read_bytes(self, job: JobRef, name: str) -> Iterator[tuple[SegmentIndex, memoryview]]:
        """A complete segment's index and its bytes, mapped read-only for the block (no
        torch: what the node daemon reads; :mod:`~weave_slurm.node.segment_bytes`)."""
        index = self.read_index(job, name)
        if not index.complete:
            raise StateError(f"segment {job.job_id}/{name} is torn: an update of "
                             f"version {index.version} did not finish")
        with mapped(self._checked(job, name, index), index.size_bytes) as view:
            yield index, view

    def attach_state(self, job: JobRef, name: str, verify: bool = False) -> AttachedState:
        """Map segment ``name`` zero-copy; raises PermissionError for other uids."""
        index = self.read_index(job, name)
        if not index.complete:
            raise StateError(f"segment {job.job_id}/{name} is torn: an update of "
                             f"version {index.version} did not finish")
        storage = self._map(job, name, index)
        if verify and index.crc32 is not None and _crc32(storage) != index.crc32:
            raise StateError(f"segment {job.job_id}/{name} fails its CRC32 check")
        return AttachedState(index=index, tensors=tensor_views(storage, index), storage=storage)

    def list_segments(self, job: JobRef | None = None) -> list[SegmentListing]:
        """Every ``*.seg`` under the root (or one job), with its index or its defect."""
        found: list[SegmentListing] = []
        for ref, jdir in self._job_dirs(job):
            for seg in sorted(jdir.glob(f"*{SEG_SUFFIX}")):
                name = seg.name.removesuffix(SEG_SUFFIX)
                found.append(self._inspect(ref, name, seg))
        return found

    def list_jobs(self) -> list[JobRef]:
        return [ref for ref, _ in self._job_dirs(None)]

    def used_bytes(self, job: JobRef | None = None) -> int:
        """Bytes of tmpfs held by segment files (including torn and temporary ones)."""
        total = 0
        for _, jdir in self._job_dirs(job):
            for path in jdir.iterdir():
                if path.is_file() and SEG_SUFFIX in path.name:
                    total += path.stat().st_blocks * 512
        return total

    # -- delete ------------------------------------------------------------------
    def delete_segment(self, job: JobRef, name: str) -> None:
        self.index_path(job, name).unlink(missing_ok=True)
        self.seg_path(job, name).unlink(missing_ok=True)

    def delete_job(self, job: JobRef) -> None:
        """Remove everything of a job on this node; a no-op when nothing is there."""
        shutil.rmtree(self.job_dir(job), ignore_errors=True)
        if self.job_dir(job).exists():
            raise StateError(f"could not remove {self.job_dir(job)}")
        with suppress(OSError):  # other jobs of the same uid, or already gone
            (self.root / str(job.uid)).rmdir()

    def remove_temporaries(self, job: JobRef) -> list[Path]:
        """Delete half-written ``*.tmp-<pid>`` and ``*.stage-<token>`` files."""
        gone = [p for mark in (TMP_MARK, STAGE_MARK)
                for p in self.job_dir(job).glob(f"*{mark}*") if p.is_file()]
        for p in gone:
            p.unlink(missing_ok=True)
        return gone

    # -- internals ---------------------------------------------------------------
    def _job_dirs(self, job: JobRef | None) -> Iterator[tuple[JobRef, Path]]:
        if job is not None:
            if self.job_dir(job).is_dir():
                yield job, self.job_dir(job)
            return
        if not self.root.is_dir():
            return
        for udir in sorted(self.root.iterdir()):
            if not (udir.is_dir() and udir.name.isdigit()):
                continue
            for jdir in sorted(udir.iterdir()):
                if jdir.is_dir() and not jdir.is_symlink():
                    try:
                        yield JobRef(jdir.name, int(udir.name)), jdir
                    except ConfigError:  # a foreign name: not ours, skip
                        log.warning("ignoring %s: not a job directory", jdir)

    def _inspect(self, job: JobRef, name: str, seg: Path) -> SegmentListing:
        size = seg.stat().st_size
        problem: str | None = None
        index: SegmentIndex | None = None
        try:
            index = SegmentIndex.loads(self.index_path(job, name).read_text(), str(seg))
            if not index.complete:
                problem = f"update to version {index.version} did not finish"
            elif index.size_bytes != size:
                problem = f"data is {size} B, index says {index.size_bytes} B"
        except FileNotFoundError:
            problem = "no index (write did not finish)"
        except StateError as exc:
            problem = str(exc)
        return SegmentListing(job, name, seg, size, None if problem else index, problem)

    def _map(self, job: JobRef, name: str, index: SegmentIndex) -> torch.UntypedStorage:
        return map_file(self._checked(job, name, index), index.size_bytes)

    def _checked(self, job: JobRef, name: str, index: SegmentIndex) -> Path:
        """The segment's data file, once it is seen to hold what its index says."""
        path = self.seg_path(job, name)
        fd = os.open(path, os.O_RDWR)  # PermissionError for another uid, before mapping
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != index.size_bytes:
            raise StateError(f"segment {path} is {size} B, its index says "
                             f"{index.size_bytes} B: torn write")
        return path

    def allocate(self, path: Path, size: int, uid: int) -> None:
        """Create ``path`` (0600, owned by ``uid``) with ``size`` bytes of real tmpfs."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            self._own_fd(fd, uid)
            if size > 0:
                os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise InsufficientResources(
                    f"{self.root}: no room for {size} B segment {path.name} "
                    "(tmpfs full); free other jobs' state or retry later") from exc
            raise
        finally:
            os.close(fd)

    def _write_index(self, job: JobRef, index: SegmentIndex) -> None:
        final = self.index_path(job, index.name)
        tmp = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            self._own_fd(fd, job.uid)
            os.write(fd, index.dumps().encode())
        finally:
            os.close(fd)
        os.replace(tmp, final)

    @staticmethod
    def _own_fd(fd: int, uid: int) -> None:
        if os.geteuid() == 0 and uid != 0:
            os.fchown(fd, uid, gid_of(uid))

    @staticmethod
    def _check_private_dir(path: Path, uid: int) -> None:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise StateError(f"{path} must be a directory owned by uid {uid}; found "
                             f"mode {oct(st.st_mode)} owner {st.st_uid}: remove it")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise StateError(f"{path} has mode {oct(stat.S_IMODE(st.st_mode))}; "
                             "expected 0700: remove it or chmod 700")


def map_file(path: Path, size_bytes: int) -> torch.UntypedStorage:
    """Map ``size_bytes`` of a file MAP_SHARED as an untyped CPU storage."""
    import torch

    storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=size_bytes)
    return cast(torch.UntypedStorage, storage)


def tensor_views(storage: torch.UntypedStorage, index: SegmentIndex) -> dict[str, torch.Tensor]:
    import torch

    base = torch.empty(0, dtype=torch.uint8).set_(storage)
    return {e.name: base[e.offset_bytes:e.offset_bytes + e.nbytes]
            .view(getattr(torch, e.dtype)).view(e.shape) for e in index.tensors}


def _crc32(storage: torch.UntypedStorage) -> int:
    import torch

    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return zlib.crc32(data.data) & 0xFFFFFFFF


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes, in name order: equal iff bit-identical."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
