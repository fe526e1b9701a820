"""Delta encoding: exact reconstruction, compact encodings, fallback, bad payloads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.sync.delta import PositionFormat, apply_delta, encode_delta
from weave_slurm.sync.sync_errors import SyncError

pytestmark = pytest.mark.torch

SPECIALS = [float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 1e-40]


def _update(base: torch.Tensor, frac: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    new = base.clone()
    n = int(frac * base.numel())
    idx = torch.randperm(base.numel(), generator=g)[:n]
    new[idx] = torch.randn(n, generator=g).to(base.dtype)
    for i, v in enumerate(SPECIALS[:n]):
        new[idx[i]] = v
    return new


@settings(max_examples=40, deadline=None)
@given(frac=st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.1, 0.5, 0.9]),
       dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float16]),
       n=st.integers(8, 5000), seed=st.integers(0, 1000))
def test_reconstruction_is_bit_exact(frac: float, dtype: torch.dtype, n: int, seed: int) -> None:
    base = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    base[0] = -0.0
    new = _update(base, frac, seed + 1)
    prev_b, new_b = base.view(torch.uint8), new.view(torch.uint8)
    encoded = encode_delta(prev_b, new_b, dtype.itemsize)
    if encoded is None:
        return  # not smaller: the caller sends the piece in full
    payload, _ = encoded
    assert payload.numel() < new_b.numel()
    out = prev_b.clone()
    apply_delta(out, payload)
    assert torch.equal(out, new_b)  # NaN-safe: compares bytes


def test_nan_payload_and_negative_zero_are_distinguished() -> None:
    base = torch.zeros(4096, dtype=torch.bfloat16)
    new = base.clone()
    new[7] = -0.0  # equal as a float, different bits
    new[9] = float("nan")
    payload, stats = encode_delta(base.view(torch.uint8), new.view(torch.uint8), 2) or (None, None)
    assert stats is not None and payload is not None
    assert stats.n_changed == 2 and stats.fmt is PositionFormat.INDICES
    out = base.view(torch.uint8).clone()
    apply_delta(out, payload)
    assert torch.equal(out, new.view(torch.uint8))


def test_dense_update_uses_bitmap_and_full_change_falls_back() -> None:
    base = torch.randn(1 << 14).bfloat16()
    dense = _update(base, 0.3, 1)
    encoded = encode_delta(base.view(torch.uint8), dense.view(torch.uint8), 2)
    assert encoded is not None and encoded[1].fmt is PositionFormat.BITMAP
    everything = (base.float() + 1).bfloat16()
    assert encode_delta(base.view(torch.uint8), everything.view(torch.uint8), 2) is None


def test_sparse_update_is_small() -> None:
    base = torch.randn(1 << 16).bfloat16()
    new = _update(base, 0.01, 2)
    encoded = encode_delta(base.view(torch.uint8), new.view(torch.uint8), 2)
    assert encoded is not None
    assert encoded[0].numel() < 0.05 * base.numel() * 2


def test_corrupt_payload_is_refused() -> None:
    base = torch.randn(1024).bfloat16()
    new = _update(base, 0.05, 3)
    payload, _ = encode_delta(base.view(torch.uint8), new.view(torch.uint8), 2) or (None, None)
    assert payload is not None
    with pytest.raises(SyncError, match="does not fit"):
        apply_delta(base.view(torch.uint8)[:512].clone(), payload)
    with pytest.raises(SyncError, match="prefix"):
        apply_delta(base.view(torch.uint8).clone(), payload[:-8])
