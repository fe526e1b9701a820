"""A restore is the one way back to a lower version: ``forget``, not ``invalidate``."""

from __future__ import annotations

import pytest

from weave_slurm.errors import VersionMismatch
from weave_slurm.sync.version_ledger import VersionLedger


def test_forget_lets_versions_start_over_for_that_job_only() -> None:
    ledger = VersionLedger()
    ledger.commit("j", 5)
    ledger.commit("k", 2)
    ledger.invalidate("j")                      # torn weights: still refuses <= 5
    with pytest.raises(VersionMismatch, match="version 3 refused, already at 5"):
        ledger.commit("j", 3)
    ledger.forget("j")                          # restored from a checkpoint at v3
    ledger.commit("j", 3)
    assert ledger.applied("j") == 3 and ledger.high_water("j") == 3
    with pytest.raises(VersionMismatch):
        ledger.commit("k", 2)                   # other jobs keep their high-water
