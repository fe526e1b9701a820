"""The node daemon's handlers of a job's segments: staged writes, reads, copies, digests.

``put`` admits a segment's size against the node's budget and stages its files;
``commit`` validates and renames them into place (``abort`` undoes a put; see
``staging``); ``attach_info`` lists a job's segments for a local reader; ``copy``
writes a checked copy of a segment under another name on this node (a staleness
ring buffer: weaved on another host cannot map this node's memory); ``digest`` gives
the SHA-256 of a segment's tensors (a finished job's final weights).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.node import segment_bytes
from weave_slurm.node.budget import MemoryBudget
from weave_slurm.node.crc import CRC_KEY
from weave_slurm.node.index import JobRef, SegmentIndex, check_name
from weave_slurm.node.protocol import Request
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.staging import Reservation, StagingArea, discard


class Daemon(Protocol):
    """What the handlers use of their node daemon (``NodeDaemon``)."""

    store: SegmentStore
    budget: MemoryBudget
    staging: StagingArea
    lock: threading.RLock

    def job(self, uid: int, request: Request, what: str = "") -> JobRef: ...

    def job_state(self, uid: int, request: Request,
                  what: str = "") -> AbstractContextManager[JobRef]: ...


class SegmentOps:
    """Segment handlers of one node daemon (its store, budget, staging and locks)."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    def put(self, uid: int, request: Request) -> dict[str, Any]:
        name = check_name("segment name", str(request.args.get("name")))
        nbytes = request.args.get("nbytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise ConfigError(f"put {request.args.get('job')}/{name}: 'nbytes' must be an "
                              f"int, got {nbytes!r}")
        with self.d.job_state(uid, request) as job:
            with self.d.lock:
                prev = self.d.budget.charged(job, name)
                self.d.budget.charge(job, name, nbytes)
            try:
                res = self.d.staging.reserve(job, name, nbytes, prev)
            except BaseException:
                with self.d.lock:
                    self._restore_charge(job, name, prev)
                raise
        return {**res.to_json(), "seg_path": str(self.d.store.seg_path(job, name)),
                "index_path": str(self.d.store.index_path(job, name)),
                "root": str(self.d.store.root), "align_bytes": self.d.store.align_bytes}

    def commit(self, uid: int, request: Request) -> dict[str, Any]:
        what = f"commit of {request.args.get('job')}/{request.args.get('name')}"
        with self.d.job_state(uid, request, what) as job:
            res = self._reservation(job, request, what)
            try:
                index = self.d.staging.commit(res)
            except BaseException:
                with self.d.lock:
                    self._restore_charge(job, res.name, res.prev_bytes)
                raise
            with self.d.lock:
                self.d.budget.force(job, res.name, index.size_bytes)
        return {"name": res.name, "version": index.version, "size_bytes": index.size_bytes}

    def abort(self, uid: int, request: Request) -> dict[str, Any]:
        what = f"abort of {request.args.get('job')}/{request.args.get('name')}"
        with self.d.job_state(uid, request, what) as job:
            res = self._reservation(job, request, what)
            discard(res)
            with self.d.lock:
                self._restore_charge(job, res.name, res.prev_bytes)
        return {"name": res.name, "aborted": True}

    def _reservation(self, job: JobRef, request: Request, what: str) -> Reservation:
        name = check_name("segment name", str(request.args.get("name")))
        return self.d.staging.take(job, name, str(request.args.get("token")), what)

    def _restore_charge(self, job: JobRef, name: str, prev_bytes: int) -> None:
        if prev_bytes:
            self.d.budget.force(job, name, prev_bytes)
        else:
            self.d.budget.release(job, name)

    def attach_info(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.d.job(uid, request)
        segments = {s.name: {"seg_path": str(s.seg_path), "index": s.index.to_json()}
                    for s in self.d.store.list_segments(job) if s.index is not None}
        return {"job": job.job_id, "uid": job.uid, "root": str(self.d.store.root),
                "segments": segments}

    def copy(self, uid: int, request: Request) -> dict[str, Any]:
        """Segment ``name`` of the job as ``as_name`` on this node, with the source's
        CRC32 in its index, read back and compared (budget-charged like a put)."""
        name = check_name("segment name", str(request.args.get("name")))
        as_name = check_name("segment name", str(request.args.get("as_name")))
        if as_name == name:
            raise ConfigError(f"copy of {name!r}: as_name must differ from name")
        with self.d.job_state(uid, request) as job:
            crc, src = self._crc32(job, name)
            with self.d.lock:
                prev = self.d.budget.charged(job, as_name)
                self.d.budget.charge(job, as_name, src.size_bytes)
            try:
                index = self.d.store.copy_segment(job, name, as_name, {CRC_KEY: crc})
                if self._crc32(job, as_name)[0] != crc:
                    raise StateError(f"job {job.job_id}: copy of {name} v{index.version} as "
                                     f"{as_name} does not match its source (CRC32 "
                                     f"{crc:#010x})")
            except BaseException:
                with self.d.lock:
                    self._restore_charge(job, as_name, prev)
                raise
            with self.d.lock:
                self.d.budget.force(job, as_name, index.size_bytes)
        return {"name": as_name, "version": index.version, "size_bytes": index.size_bytes,
                "crc32": crc}

    def digest(self, uid: int, request: Request) -> dict[str, Any]:
        """SHA-256 over the segment's tensor names, dtypes, shapes and bytes."""
        name = check_name("segment name", str(request.args.get("name")))
        with self.d.job_state(uid, request) as job:
            self._known(job, name)
            with self.d.store.read_bytes(job, name) as (index, view):
                return {"name": name, "version": index.version,
                        "sha256": segment_bytes.digest(view, index)}

    def _crc32(self, job: JobRef, name: str) -> tuple[int, SegmentIndex]:
        self._known(job, name)
        with self.d.store.read_bytes(job, name) as (index, view):
            return segment_bytes.crc32(view), index

    def _known(self, job: JobRef, name: str) -> None:
        names = {s.name for s in self.d.store.list_segments(job) if s.index is not None}
        if name not in names:
            raise StateError(f"job {job.job_id}: this node has no segment {name!r} (has "
                             f"{sorted(names)})")
