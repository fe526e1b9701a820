"""Chunking, checksums and message tags of one stage-1 piece (pure)."""

from __future__ import annotations

import zlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from weave_slurm.errors import ConfigError
from weave_slurm.sync.pieces import (
    MAX_CHUNKS,
    Slot,
    chunk_bytes,
    chunk_crcs,
    chunk_spans,
    crc32_into,
    is_payload_tag,
    tag,
)
from weave_slurm.sync.topology import ALIGN_BYTES

pytestmark = pytest.mark.torch


@given(nbytes=st.integers(0, 1 << 34), chunk=st.integers(1, 1 << 16))
def test_chunks_cover_the_payload_exactly_and_stay_aligned(nbytes: int, chunk: int) -> None:
    spans = chunk_spans(nbytes, chunk * ALIGN_BYTES)
    assert len(spans) <= MAX_CHUNKS
    covered = 0
    for off, n in spans:
        assert off == covered and n > 0 and off % ALIGN_BYTES == 0
        covered += n
    assert covered == nbytes
    assert all(n == chunk_bytes(nbytes, chunk * ALIGN_BYTES) for _, n in spans[:-1])


@pytest.mark.parametrize("bad", [0, 63, 100, -64])
def test_bad_chunk_size_is_a_config_error(bad: int) -> None:
    with pytest.raises(ConfigError, match="chunk_nbytes"):
        chunk_spans(1 << 20, bad)


def test_tags_are_unique_and_payloads_are_recognised() -> None:
    seen: dict[int, tuple[int, int, int, bool]] = {}
    for piece in range(40):
        for rnd in range(2):
            for relay in (False, True):
                for slot in (*Slot, Slot.PAYLOAD + 1, Slot.PAYLOAD + MAX_CHUNKS - 1):
                    t = tag(piece, int(slot), rnd, relay)
                    assert t not in seen, (seen[t], (piece, slot, rnd, relay))
                    assert 0 <= t < 2**31  # MPI_TAG_UB of Open MPI
                    seen[t] = (piece, int(slot), rnd, relay)
                    assert is_payload_tag(t) == (slot >= Slot.PAYLOAD)
    with pytest.raises(ConfigError):
        tag(0, Slot.PAYLOAD + MAX_CHUNKS, 0, False)
    with pytest.raises(ConfigError):
        tag(0, Slot.HEAD, 2, False)


def test_incremental_crc_matches_zlib_and_sees_a_flipped_bit() -> None:
    buf = torch.randint(0, 256, (300_000,), dtype=torch.uint8)
    whole = zlib.crc32(bytes(buf.numpy()))
    assert crc32_into(buf) == whole
    assert crc32_into(buf[100_000:], crc32_into(buf[:100_000])) == whole
    trailer = chunk_crcs(buf, 64 * 1024)
    assert trailer.numel() == len(chunk_spans(buf.numel(), 64 * 1024)) == 5
    flipped = buf.clone()
    flipped[200_001] ^= 4
    diff = (chunk_crcs(flipped, 64 * 1024) != trailer).nonzero().reshape(-1).tolist()
    assert diff == [200_001 // (64 * 1024)]
