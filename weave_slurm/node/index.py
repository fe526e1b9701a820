"""The metadata index written next to every warm-state segment.

A segment ``<name>.seg`` is raw bytes; its index ``<name>.json`` says what the bytes
are: one entry per tensor (name, dtype, shape, byte offset, byte length), the
alignment, the weight version, an optional CRC32, free-form JSON ``extra`` state (RNG
seeds, data-loader position, environment state) and a ``complete`` flag. The index is
written atomically (tmp + rename) *after* the data, and rewritten with
``complete=false`` before an in-place update, so a segment whose index is missing,
unparsable, incomplete or disagrees with the data file's size is *torn*.

This module is pure (no torch, no file system): dtypes travel as their torch names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError, StateError

#: Default root of a node's segment store (a tmpfs).
DEFAULT_ROOT = Path("/dev/shm/weave")

INDEX_FORMAT = 1
DEFAULT_ALIGN_BYTES = 64
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\Z")

# dtype name -> bytes per element; the only dtypes a segment can hold.
DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16,
}


#: Segments named ``device.<role>`` hold a resident worker's switched-out device state
#: (docs/node.md, "Device switch"): scratch only that worker reads back, never
#: checkpointed, removed when a daemon restarts (its workers are gone).
SCRATCH_PREFIX = "device."
SCRATCH_KEY = "scratch"


def scratch_name(role: str) -> str:
    return SCRATCH_PREFIX + role


def is_scratch(name: str) -> bool:
    return name.startswith(SCRATCH_PREFIX)


def check_name(kind: str, value: str) -> str:
    """Validate a job id or segment name (it becomes a path component)."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ConfigError(
            f"{kind} {value!r} is not valid: use 1-64 characters from [A-Za-z0-9._-], "
            "not starting with '.' or '-'")
    return value


def align_up(offset_bytes: int, align_bytes: int) -> int:
    return (offset_bytes + align_bytes - 1) // align_bytes * align_bytes


@dataclass(frozen=True)
class JobRef:
    """A job as the node knows it: its id and the uid that owns its state."""

    job_id: str
    uid: int

    def __post_init__(self) -> None:
        check_name("job id", self.job_id)
        if not isinstance(self.uid, int) or self.uid < 0:
            raise ConfigError(f"job {self.job_id!r}: uid {self.uid!r} must be an int >= 0")


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives inside a segment."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset_bytes: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "offset_bytes": self.offset_bytes, "nbytes": self.nbytes}


@dataclass(frozen=True)
class SegmentIndex:
    """The decoded ``<name>.json`` of one segment."""

    name: str
    version: int
    size_bytes: int
    align_bytes: int
    tensors: tuple[TensorEntry, ...]
    created_s: float
    updated_s: float
    complete: bool = True
    crc32: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def entry(self, tensor: str) -> TensorEntry:
        for e in self.tensors:
            if e.name == tensor:
                return e
        names = ", ".join(e.name for e in self.tensors)
        raise StateError(f"segment {self.name!r} has no tensor {tensor!r}; it has: {names}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": INDEX_FORMAT, "name": self.name, "version": self.version,
            "size_bytes": self.size_bytes, "align_bytes": self.align_bytes,
            "complete": self.complete, "crc32": self.crc32,
            "created_s": self.created_s, "updated_s": self.updated_s,
            "tensors": [e.to_json() for e in self.tensors], "extra": self.extra,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def loads(cls, text: str, where: str) -> SegmentIndex:
        """Parse and validate an index; any defect raises StateError naming ``where``."""
        try:
            raw = json.loads(text)
            if raw.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {raw.get('format')!r}, expected {INDEX_FORMAT}")
            entries = tuple(
                TensorEntry(name=str(t["name"]), dtype=str(t["dtype"]),
                            shape=tuple(int(d) for d in t["shape"]),
                            offset_bytes=int(t["offset_bytes"]), nbytes=int(t["nbytes"]))
                for t in raw["tensors"])
            crc = raw.get("crc32")
            index = cls(
                name=str(raw["name"]), version=int(raw["version"]),
                size_bytes=int(raw["size_bytes"]), align_bytes=int(raw["align_bytes"]),
                tensors=entries, created_s=float(raw["created_s"]),
                updated_s=float(raw["updated_s"]), complete=bool(raw["complete"]),
                crc32=None if crc is None else int(crc), extra=dict(raw.get("extra") or {}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"segment index {where} is corrupt: {exc}") from exc
        index.validate(where)
        return index

    def validate(self, where: str) -> None:
        """Check that the entries are inside the segment, aligned and consistent."""
        for e in self.tensors:
            size = DTYPE_ITEMSIZE.get(e.dtype)
            if size is None:
                raise StateError(f"segment index {where}: tensor {e.name!r} has dtype "
                                 f"{e.dtype!r}; valid: {', '.join(DTYPE_ITEMSIZE)}")
            numel = 1
            for d in e.shape:
                numel *= d
            if numel * size != e.nbytes or e.offset_bytes % size or e.offset_bytes < 0 \
                    or e.offset_bytes + e.nbytes > self.size_bytes:
                raise StateError(f"segment index {where}: tensor {e.name!r} (offset "
                                 f"{e.offset_bytes}, {e.nbytes} B) does not fit the "
                                 f"{self.size_bytes} B segment")


def plan_layout(specs: list[tuple[str, str, tuple[int, ...]]],
                align_bytes: int = DEFAULT_ALIGN_BYTES) -> tuple[tuple[TensorEntry, ...], int]:
    """Lay out ``(name, dtype, shape)`` tensors back to back, each aligned.

    Returns the entries and the total segment size in bytes (at least one page, so an
    empty state still maps).
    """
    if align_bytes < 16 or align_bytes & (align_bytes - 1):
        raise ConfigError(f"align_bytes {align_bytes!r} must be a power of two >= 16")
    seen: set[str] = set()
    entries: list[TensorEntry] = []
    offset = 0
    for name, dtype, shape in specs:
        if name in seen:
            raise ConfigError(f"tensor name {name!r} appears twice in one segment")
        seen.add(name)
        size = DTYPE_ITEMSIZE.get(dtype)
        if size is None:
            raise ConfigError(f"tensor {name!r}: dtype {dtype!r} cannot be stored; "
                              f"valid: {', '.join(DTYPE_ITEMSIZE)}")
        numel = 1
        for d in shape:
            numel *= d
        offset = align_up(offset, align_bytes)
        entries.append(TensorEntry(name, dtype, tuple(shape), offset, numel * size))
        offset += numel * size
    return tuple(entries), max(align_up(offset, 4096), 4096)
