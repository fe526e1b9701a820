"""Wire header, job hashes and the receiver's version ledger."""

from __future__ import annotations

import pytest
import torch

from weave_slurm.errors import VersionMismatch
from weave_slurm.sync.flat_layout import WeightLayout
from weave_slurm.sync.header import PieceHeader, SyncMode, crc32, empty_header, job_hash
from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.version_ledger import VersionLedger

pytestmark = pytest.mark.torch


def test_header_round_trips_and_rejects_garbage() -> None:
    head = PieceHeader(job_hash("job-a"), 7, 6, 3, SyncMode.DELTA, 1234, 0xDEADBEEF, 42)
    assert PieceHeader.from_tensor(head.to_tensor()) == head
    with pytest.raises(SyncError, match="magic"):
        PieceHeader.from_tensor(empty_header())
    assert job_hash("job-a") != job_hash("job-b")
    assert 0 <= job_hash("x") < 2**63


def test_crc_sees_a_single_flipped_bit() -> None:
    buf = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    flipped = buf.clone()
    flipped[100] ^= 1
    assert crc32(buf) != crc32(flipped)
    assert crc32(buf.view(torch.int32)) == crc32(buf)


def test_ledger_refuses_stale_and_duplicate_versions() -> None:
    ledger = VersionLedger()
    ledger.commit("j", 3)
    with pytest.raises(VersionMismatch, match="version 3 refused"):
        ledger.commit("j", 3)
    with pytest.raises(VersionMismatch, match="version 2 refused"):
        ledger.check_fresh("j", 2)
    ledger.invalidate("j")
    assert ledger.applied("j") is None and not ledger.is_fresh("j", 3)
    ledger.commit("j", 4)
    assert ledger.applied("j") == 4
    assert ledger.is_fresh("other", 0)


def test_layout_round_trips_mixed_dtypes() -> None:
    tensors = {"a": torch.randn(3, 5).bfloat16(), "b": torch.randn(7),
               "c": torch.arange(3, dtype=torch.int8)}
    layout = WeightLayout.of(tensors)
    assert layout.word_bytes == 1
    views = layout.views(layout.flatten(tensors))
    for k, v in tensors.items():
        assert torch.equal(views[k].view(torch.uint8), v.view(torch.uint8))
