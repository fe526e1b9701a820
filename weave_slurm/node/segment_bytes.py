"""A segment's bytes without torch: what the node daemon does with them.

The node daemon never builds tensors. It checkpoints, restores, copies, checks and
hashes the bytes of segments that its clients (workers, sync agents: they import torch)
fill and read through tensor views (:mod:`weave_slurm.node.segments`). Doing that on a
plain ``mmap`` keeps torch out of ``weave node serve``, which then starts in a fraction
of the CPU time (torch's import alone is about 2 s of CPU on a 2-core machine), at every
node daemon start. The figures are the tensor-level ones: :func:`crc32` is
``crc.storage_crc32`` of the mapped storage, :func:`digest` is
``segments.weights_digest`` of its tensor views (tests/node/test_segment_bytes.py).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from weave_slurm.errors import StateError
from weave_slurm.node.index import SegmentIndex

CHUNK_BYTES = 64 << 20


@contextmanager
def mapped(path: Path, size: int, write: bool = False) -> Iterator[memoryview]:
    """``size`` bytes of the file at ``path``, mapped MAP_SHARED (read-only unless
    ``write``); the view is released when the block ends, so keep no slice of it."""
    if size == 0:
        yield memoryview(bytearray())
        return
    fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
    view = memoryview(mm)
    try:
        yield view
    finally:
        view.release()
        mm.close()


def crc32(view: memoryview) -> int:
    """CRC32 of the bytes (as ``crc.storage_crc32`` of the same mapping)."""
    crc = 0
    for start in range(0, len(view), CHUNK_BYTES):
        with view[start:start + CHUNK_BYTES] as part:
            crc = zlib.crc32(part, crc)
    return crc & 0xFFFFFFFF


def digest(view: memoryview, index: SegmentIndex) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes, in name order (as
    ``segments.weights_digest`` of the segment's tensor views): equal iff bit-identical."""
    h = hashlib.sha256()
    for e in sorted(index.tensors, key=lambda e: e.name):
        h.update(f"{e.name}:torch.{e.dtype}:{tuple(e.shape)};".encode())
        with view[e.offset_bytes:e.offset_bytes + e.nbytes] as part:
            h.update(part)
    return h.hexdigest()


def write_out(view: memoryview, dst: BinaryIO) -> None:
    """Every byte of ``view`` to ``dst``, a chunk at a time."""
    for start in range(0, len(view), CHUNK_BYTES):
        with view[start:start + CHUNK_BYTES] as part:
            dst.write(part)


def read_in(src: BinaryIO, view: memoryview, what: str) -> None:
    """Fill ``view`` from ``src``; StateError where ``src`` ends first."""
    done = 0
    while done < len(view):
        with view[done:done + CHUNK_BYTES] as part:
            got = src.readinto(part)  # type: ignore[attr-defined]
        if not got:
            raise StateError(f"{what}: source ends {len(view) - done} B early")
        done += got
