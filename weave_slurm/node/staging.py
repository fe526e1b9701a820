"""Two-step segment writes through the daemon: reserve and stage, write, commit.

Why: a client that created segment files itself after the daemon's ``put`` reply could
re-create the directory of a job that a concurrent ``drop`` had just removed. Now only
the daemon creates files of a job, and only while it holds the job's state lock:

1. ``put``: the daemon charges the budget and creates ``<name>.seg.stage-<token>``
   (fallocated, 0600, owned by the job's uid) and an empty ``<name>.json.stage-<token>``;
2. the client opens both *without* ``O_CREAT`` (so a dropped job's files cannot come
   back: ENOENT), maps the data file through the descriptor it opened, copies the
   tensors and writes the index;
3. ``commit``: under the state lock, the daemon checks that the reservation still
   exists (``drop`` removes it with the job's directory; a newer ``put`` of the same
   segment replaces it), validates the staged index against the staged data, and
   renames both into place; otherwise it deletes the staged files and refuses.

A late writer whose job was dropped keeps writing into unlinked pages (freed when it
unmaps) and gets a ``StateError`` from ``commit``. Stale stage files of a crashed
writer are removed by the next ``put`` of that segment, by ``drop``, and by recovery.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from weave_slurm.errors import StateError
from weave_slurm.node.index import JobRef, SegmentIndex
from weave_slurm.node.segments import STAGE_MARK, SegmentStore, map_file, tensor_views

if TYPE_CHECKING:
    import torch

_TOKEN_RE = re.compile(r"^[0-9a-f]{16}\Z")


@dataclass(frozen=True)
class Reservation:
    """A staged segment the daemon created for one ``put``; ``prev_bytes`` is the
    budget charge of the segment it would replace (0 if none)."""

    job: JobRef
    name: str
    token: str
    nbytes: int
    prev_bytes: int
    seg_path: Path
    index_path: Path

    def to_json(self) -> dict[str, object]:
        return {"token": self.token, "stage_seg_path": str(self.seg_path),
                "stage_index_path": str(self.index_path), "size_bytes": self.nbytes}


def stage_paths(store: SegmentStore, job: JobRef, name: str, token: str) -> tuple[Path, Path]:
    if not _TOKEN_RE.match(token):
        raise StateError(f"segment {job.job_id}/{name}: bad staging token {token!r} "
                         "(expected the 16 hex digits that 'put' returned)")
    seg, index = store.seg_path(job, name), store.index_path(job, name)
    return (seg.with_name(f"{seg.name}{STAGE_MARK}{token}"),
            index.with_name(f"{index.name}{STAGE_MARK}{token}"))


class StagingArea:
    """The daemon's open reservations; the caller holds the job's state lock."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self._open: dict[tuple[JobRef, str], Reservation] = {}
        self._lock = threading.Lock()

    def reserve(self, job: JobRef, name: str, nbytes: int, prev_bytes: int) -> Reservation:
        """Create the stage files (replacing an older reservation of the segment)."""
        old = self.pop(job, name)
        if old is not None:
            discard(old)
            prev_bytes = old.prev_bytes
        token = secrets.token_hex(8)
        seg, index = stage_paths(self.store, job, name, token)
        self.store.check_job_dir(job)
        res = Reservation(job, name, token, nbytes, prev_bytes, seg, index)
        try:
            self.store.allocate(seg, nbytes, job.uid)
            self.store.allocate(index, 0, job.uid)
        except BaseException:
            discard(res)
            raise
        with self._lock:
            self._open[(job, name)] = res
        return res

    def take(self, job: JobRef, name: str, token: str, what: str) -> Reservation:
        """Close the open put ``token`` names, or delete its stage files and refuse."""
        seg, index = stage_paths(self.store, job, name, token)
        with self._lock:
            res = self._open.get((job, name))
            if res is not None and res.token == token:
                return self._open.pop((job, name))
        discard(Reservation(job, name, token, 0, 0, seg, index))
        raise StateError(f"{what} refused: no open put with token {token!r} (a newer put "
                         "of this segment replaced it); put it again")

    def pop(self, job: JobRef, name: str) -> Reservation | None:
        with self._lock:
            return self._open.pop((job, name), None)

    def forget_job(self, job: JobRef) -> list[Reservation]:
        """Drop every reservation of ``job`` and delete its stage files."""
        with self._lock:
            gone = [r for k, r in self._open.items() if k[0] == job]
            for r in gone:
                del self._open[(job, r.name)]
        for r in gone:
            discard(r)
        return gone

    def commit(self, res: Reservation) -> SegmentIndex:
        """Validate the staged index and data, then rename both into place."""
        where = f"commit of {res.job.job_id}/{res.name}"
        try:
            index = SegmentIndex.loads(res.index_path.read_text(), str(res.index_path))
            index.validate(where)
            size = os.stat(res.seg_path, follow_symlinks=False).st_size
            if index.name != res.name or index.size_bytes != size or size != res.nbytes:
                raise StateError(
                    f"{where} refused: staged index names {index.name!r} of "
                    f"{index.size_bytes} B, the staged data is {size} B and 'put' reserved "
                    f"{res.nbytes} B; put it again")
            with self.store.job_lock(res.job):
                # Old index first: between the renames the segment reads as torn.
                self.store.index_path(res.job, res.name).unlink(missing_ok=True)
                os.replace(res.seg_path, self.store.seg_path(res.job, res.name))
                os.replace(res.index_path, self.store.index_path(res.job, res.name))
        except FileNotFoundError as exc:
            discard(res)
            raise StateError(f"{where} refused: staged file {exc.filename} is gone") from None
        except BaseException:
            discard(res)
            raise
        return index


def discard(res: Reservation) -> None:
    res.seg_path.unlink(missing_ok=True)
    res.index_path.unlink(missing_ok=True)


def write_staged(seg_path: Path, index_path: Path, index: SegmentIndex,
                 tensors: Mapping[str, torch.Tensor]) -> None:
    """Client side: fill stage files that the daemon created; never creates a file.

    Raises ``FileNotFoundError`` when they are gone (the job was dropped, or a newer
    ``put`` of the segment replaced this one).
    """
    from weave_slurm.device.hostmem import fill_host  # torch: the client's, not the daemon's

    fd = os.open(seg_path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size != index.size_bytes:
            raise StateError(f"stage file {seg_path} is {size} B, the index needs "
                             f"{index.size_bytes} B")
        # map the inode we opened, not whatever the path names by now
        storage = map_file(Path(f"/proc/self/fd/{fd}"), size)
    finally:
        os.close(fd)
    views = tensor_views(storage, index)
    fill_host(storage, ((src.detach(), views[key]) for key, src in tensors.items()))
    del views, storage
    fd = os.open(index_path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "wb") as out:
        out.write(index.dumps().encode())
