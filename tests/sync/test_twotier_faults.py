"""Failures surface as errors on every surviving rank, within a bounded time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from weave_slurm.sync.group_launch import run_group
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import LinkSpec
from weave_slurm.sync.scenario import Scenario

pytestmark = pytest.mark.torch

VersionsFactory = Callable[[int, list[float]], tuple[str, ...]]
LOOPBACK = LinkSpec(rate_mbit=None)
MIB = 1 << 20


def test_corrupt_after_retry_is_reported_everywhere(make_versions: VersionsFactory) -> None:
    files = make_versions(MIB, [])
    sc = Scenario("job-corrupt", n_train=2, n_rollout=2, total_nbytes=MIB, version_files=files,
                  versions=(1,), corrupt_attempts=2)
    outcomes = run_group(sc, LOOPBACK)
    for o in outcomes:
        assert o.result is not None, o.stderr
        step = o.result["steps"][0]
        assert not step["ok"] and step["error"] == "ShardCorrupt", step


def test_killed_rollout_peer_is_an_error_not_a_hang(make_versions: VersionsFactory) -> None:
    files = make_versions(8 * MIB, [0.01])
    # rank 3 (a rollout rank) SIGKILLs itself as the payload of the 2nd push starts
    sc = Scenario("job-kill", n_train=2, n_rollout=2, total_nbytes=8 * MIB,
                  version_files=files, versions=(1, 2), mode=SyncMode.DELTA, timeout_s=15.0,
                  die_rank=3, die_at=1)
    outcomes = run_group(sc, LOOPBACK)
    dead = outcomes[3]
    assert dead.returncode == -9 and dead.result is None
    for o in outcomes[:3]:
        assert o.returncode == 0 and o.result is not None, o.stderr  # exited, not killed
        assert o.result["steps"][0]["ok"]
    # rank 1 streams to rank 3, rank 2 all-gathers with it; rank 0's own stream (to 2)
    # completes, so it may succeed: the group runtime sees the errors of ranks 1 and 2
    for o in outcomes[1:3]:
        assert o.result is not None
        second = o.result["steps"][1]
        assert not second["ok"] and second["error"] == "SyncError", second
        assert "rank 3" in second["message"] or "pool 'rollout'" in second["message"]
