"""How one stage-1 piece travels: its chunks, their checksums and the message tags (pure).

A piece goes as a header, its payload cut into chunks of ``chunk_nbytes`` (so that
several messages are in flight per stream and the receiver can checksum and relay
chunk ``k`` while chunk ``k + 1`` is still on the wire), then a trailer: the CRC32 of
every chunk of the (reconstructed) piece, which the sender computes while its chunks
are in flight. The owner of a shard relays the same header, chunks and trailer to the
other rollout ranks (``relay=True`` tags), so stage 2 overlaps stage 1.
"""

from __future__ import annotations

import enum
import zlib

import torch

from weave_slurm.errors import ConfigError
from weave_slurm.sync.topology import ALIGN_BYTES

MAX_CHUNKS = 4096  # per piece; larger pieces get larger chunks
_SLOTS = MAX_CHUNKS + 3
_ROUNDS_IN_TAG = 2


class Slot(enum.IntEnum):
    """The kind of message inside one piece's tag range (payload chunk ``i`` is 3 + i)."""

    HEAD = 0
    TRAILER = 1
    STATUS = 2
    PAYLOAD = 3


def chunk_bytes(nbytes: int, chunk_nbytes: int) -> int:
    """The chunk size actually used for a payload of ``nbytes`` (at most MAX_CHUNKS)."""
    if chunk_nbytes < ALIGN_BYTES or chunk_nbytes % ALIGN_BYTES:
        raise ConfigError(f"sync chunk_nbytes {chunk_nbytes!r}: must be a positive multiple "
                          f"of {ALIGN_BYTES}")
    floor = -(-nbytes // MAX_CHUNKS)
    floor = -(-floor // ALIGN_BYTES) * ALIGN_BYTES
    return max(chunk_nbytes, floor)


def chunk_spans(nbytes: int, chunk_nbytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of every chunk of a payload of ``nbytes`` (none when empty)."""
    size = chunk_bytes(nbytes, chunk_nbytes)
    return [(off, min(size, nbytes - off)) for off in range(0, nbytes, size)]


def tag(piece: int, slot: int, rnd: int, relay: bool) -> int:
    """The message tag of ``slot`` (a :class:`Slot` or ``Slot.PAYLOAD + chunk``) of a piece
    in round ``rnd``; relayed copies (rollout owner -> its peers) use their own range."""
    if not 0 <= slot < _SLOTS or not 0 <= rnd < _ROUNDS_IN_TAG:
        raise ConfigError(f"sync tag: slot {slot!r} or round {rnd!r} out of range")
    return ((piece * _ROUNDS_IN_TAG + rnd) * 2 + int(relay)) * _SLOTS + slot


def is_payload_tag(t: int) -> bool:
    """Whether a tag names a payload chunk (fault-injection hooks use this)."""
    return t % _SLOTS >= Slot.PAYLOAD


def crc32_into(buf: torch.Tensor, value: int = 0) -> int:
    """CRC32 of a CPU ``uint8`` tensor's bytes, continuing from ``value`` (no copies)."""
    if buf.device.type != "cpu":
        buf = buf.cpu()
    if not buf.numel():
        return value
    return zlib.crc32(buf.numpy().data, value) & 0xFFFF_FFFF


def chunk_crcs(piece: torch.Tensor, chunk_nbytes: int) -> torch.Tensor:
    """The trailer of a piece: ``int64`` CRC32 of each of its chunks."""
    spans = chunk_spans(piece.numel(), chunk_nbytes)
    return torch.tensor([crc32_into(piece[o:o + n]) for o, n in spans], dtype=torch.int64)
