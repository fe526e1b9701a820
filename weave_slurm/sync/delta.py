"""Delta encoding of a piece: only the words that changed since the last sync.

Words are compared as integers (``int16`` for bf16, ``int32`` for fp32, ...), so NaN
payloads, -0.0 and denormals round-trip bit for bit. The changed positions are sent as
``int32`` indices when sparse or as a bitmap when denser, whichever is smaller, followed
by the new words. :func:`encode_delta` returns ``None`` when the delta would not be
smaller than the piece itself (the caller then sends it in full).

Payload layout (all sections 8-byte aligned): ``int64[4]`` prefix
``(position_format, n_changed, word_bytes, n_words)``, positions, values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from weave_slurm.errors import ConfigError
from weave_slurm.sync.sync_errors import SyncError

_PREFIX_BYTES = 32
_WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class PositionFormat(enum.IntEnum):
    INDICES = 0
    BITMAP = 1


@dataclass(frozen=True)
class DeltaStats:
    """What a delta of one piece contains."""

    n_words: int
    n_changed: int
    fmt: PositionFormat
    payload_nbytes: int


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def _words(buf: torch.Tensor, word_bytes: int) -> torch.Tensor:
    if word_bytes not in _WORD_DTYPES:
        raise ConfigError(f"delta word size {word_bytes!r} bytes; valid: {sorted(_WORD_DTYPES)}")
    if buf.numel() % word_bytes:
        raise ConfigError(f"piece of {buf.numel()} bytes is not a multiple of the word size "
                          f"{word_bytes}")
    return buf.view(_WORD_DTYPES[word_bytes])


def _sizes(n_words: int, n_changed: int, word_bytes: int) -> tuple[PositionFormat, int]:
    idx_bytes, map_bytes = 4 * n_changed, -(-n_words // 8)
    fmt = PositionFormat.INDICES if idx_bytes <= map_bytes else PositionFormat.BITMAP
    pos = _pad8(min(idx_bytes, map_bytes))
    return fmt, _PREFIX_BYTES + pos + _pad8(n_changed * word_bytes)


def encode_delta(prev: torch.Tensor, new: torch.Tensor, word_bytes: int
                 ) -> tuple[torch.Tensor, DeltaStats] | None:
    """Encode ``new`` against ``prev`` (equal-length CPU ``uint8`` tensors); ``None`` when
    the delta would not be smaller than ``new``."""
    if prev.numel() != new.numel():
        raise ConfigError(f"delta: previous piece has {prev.numel()} bytes, new has "
                          f"{new.numel()}")
    old_w, new_w = _words(prev, word_bytes), _words(new, word_bytes)
    changed = (old_w != new_w).numpy()
    n_words, n_changed = new_w.numel(), int(np.count_nonzero(changed))
    fmt, total = _sizes(n_words, n_changed, word_bytes)
    if total >= new.numel():
        return None  # decided before the costlier index pass
    idx = np.flatnonzero(changed)
    payload = torch.zeros(total, dtype=torch.uint8)
    payload[:_PREFIX_BYTES].view(torch.int64).copy_(
        torch.tensor([int(fmt), n_changed, word_bytes, n_words], dtype=torch.int64))
    pos_end = total - _pad8(n_changed * word_bytes)
    if fmt is PositionFormat.INDICES:
        payload[_PREFIX_BYTES:_PREFIX_BYTES + 4 * n_changed].view(torch.int32).numpy()[:] = idx
    else:  # bit b of byte i is word 8 * i + b
        bits = np.packbits(changed, bitorder="little")
        payload[_PREFIX_BYTES:_PREFIX_BYTES + bits.size].numpy()[:] = bits
    values = new_w.numpy()[idx]
    payload[pos_end:pos_end + n_changed * word_bytes].view(new_w.dtype).numpy()[:] = values
    return payload, DeltaStats(n_words, n_changed, fmt, total)


def apply_delta(base: torch.Tensor, payload: torch.Tensor) -> DeltaStats:
    """Apply ``payload`` to ``base`` (a CPU ``uint8`` piece) in place; nothing is written
    unless the payload is well formed."""
    if payload.numel() < _PREFIX_BYTES:
        raise SyncError(f"delta payload of {payload.numel()} bytes is shorter than its prefix")
    fmt_code, n_changed, word_bytes, n_words = (
        int(x) for x in payload[:_PREFIX_BYTES].view(torch.int64).tolist())
    if fmt_code not in (0, 1) or word_bytes not in _WORD_DTYPES:
        raise SyncError(f"delta payload: bad format {fmt_code!r} or word size {word_bytes!r}")
    fmt = PositionFormat(fmt_code)
    if n_words * word_bytes != base.numel() or not 0 <= n_changed <= n_words:
        raise SyncError(f"delta payload for {n_words}x{word_bytes} bytes ({n_changed} changed) "
                        f"does not fit a piece of {base.numel()} bytes")
    _, total = _sizes(n_words, n_changed, word_bytes)
    if payload.numel() != total:
        raise SyncError(f"delta payload has {payload.numel()} bytes, its prefix says {total}")
    base_w = _words(base, word_bytes)
    pos_end = total - _pad8(n_changed * word_bytes)
    values = payload[pos_end:pos_end + n_changed * word_bytes].view(base_w.dtype).numpy()
    if fmt is PositionFormat.INDICES:
        idx = payload[_PREFIX_BYTES:_PREFIX_BYTES + 4 * n_changed].view(torch.int32).numpy()
        if n_changed and (int(idx.min()) < 0 or int(idx.max()) >= n_words):
            raise SyncError("delta payload: changed-word index out of range")
    else:
        packed = payload[_PREFIX_BYTES:_PREFIX_BYTES + -(-n_words // 8)].numpy()
        idx = np.flatnonzero(np.unpackbits(packed, count=n_words, bitorder="little"))
        if idx.size != n_changed:
            raise SyncError("delta payload: bitmap population does not match its prefix")
    base_w.numpy()[idx] = values
    return DeltaStats(n_words, n_changed, fmt, total)
