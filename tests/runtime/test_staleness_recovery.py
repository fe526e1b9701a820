"""A k = 2 member alone: its rollouts overlap its training, and a kill replays its window.

Killed mid-training at version 2, the member is restored from its newest checkpoint,
which holds the ring of its last k + 1 weight versions; the replayed rollouts use
exactly the versions they used before, so it still matches a solo k = 2 run bit for bit.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.helpers import OPTIONS, assert_same_as_solo
from tests.runtime.test_isolation import _worker_pid
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.runner import GroupRunner, Member, RunnerConfig
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch


def _spans(ex: GroupRunner, job_id: str, kind: Phase) -> list[tuple[float, float]]:
    return sorted((s.start_s, s.end_s) for s in ex.spans
                  if s.job_id == job_id and s.kind is kind and s.ok)


def test_k2_member_overlaps_its_phases_and_replays_its_window_after_a_kill(
        local_fleet: object, tmp_path: Path) -> None:
    spec = MemberSpec("x0", seed=31, steps=4, options=OPTIONS, staleness=2)
    ex = GroupRunner(local_fleet.layout, [spec],  # type: ignore[attr-defined]
                       config=RunnerConfig(records_dir=tmp_path))
    killed: list[int] = []

    def watch(member: Member, why: str) -> None:
        if member.state is MemberState.TRAIN and member.version == 2 and not killed:
            pid = _worker_pid(member.train_node, "x0")
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    ex.listeners.append(watch)
    try:
        ex.run(timeout_s=240)
        assert killed and ex.members["x0"].recoveries == 1
        assert ex.members["x0"].state is MemberState.DONE
        # alone on its nodes, its next rollout ran next to its training step
        rolls = _spans(ex, "x0", Phase.ROLLOUT)
        trains = _spans(ex, "x0", Phase.TRAIN)[1:]     # without init
        assert any(r0 < t1 and t0 < r1 for r0, r1 in rolls for t0, t1 in trains), \
            "rollout and training of the k = 2 member never overlapped"
        log = VersionLog.load(tmp_path / "x0.versions.jsonl")
        assert [(r.step, r.weights_version, r.consumed_at) for r in log] == \
            [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 3)]
        assert all(r.weights_version <= r.newest_version for r in log)
        assert_same_as_solo(ex, spec)      # replayed from the checkpoint's three buffers
    finally:
        if "x0" in ex.order:
            ex.leave("x0")
        ex.close()
