"""A k = 2 member alone: its rollouts overlap its training, and a kill replays its window.

Killed mid-training at version 2, the member is restored from its newest checkpoint,
which holds the ring of its last k + 1 weight versions; the replayed rollouts use
exactly the versions they used before, so it still matches a solo k = 2 run bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.processes import kill_worker
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, each_change, leave_all, ok_spans
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig, RunningMember
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch


def test_k2_member_overlaps_its_phases_and_replays_its_window_after_a_kill(
        local_fleet: object, tmp_path: Path) -> None:
    spec = MemberSpec("x0", seed=31, steps=4, options=OPTIONS, staleness=2)
    ex = GroupRunner(local_fleet.layout, [spec],  # type: ignore[attr-defined]
                       config=RunnerConfig(records_dir=tmp_path))
    killed: list[int] = []

    def watch(member: RunningMember, change: MemberChanged) -> None:
        if member.state is change.state is MemberState.TRAIN and member.version == 2 \
                and not killed:
            killed.append(kill_worker(member.train_node.socket_path, "x0"))

    try:
        ex.run(timeout_s=240, on_tick=each_change(ex, watch))
        assert killed and ex.members["x0"].recoveries == 1
        assert ex.members["x0"].state is MemberState.DONE
        # alone on its nodes, its next rollout ran next to its training step
        rolls = ok_spans(ex, "x0", Phase.ROLLOUT)
        trains = ok_spans(ex, "x0", Phase.TRAIN)[1:]     # without init
        assert any(r0 < t1 and t0 < r1 for r0, r1 in rolls for t0, t1 in trains), \
            "rollout and training of the k = 2 member never overlapped"
        log = VersionLog.load(tmp_path / "x0.versions.jsonl")
        assert [(r.step, r.weights_version, r.consumed_at) for r in log] == \
            [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 3)]
        assert all(r.weights_version <= r.newest_version for r in log)
        assert_same_as_solo(ex, spec)      # replayed from the checkpoint's three buffers
    finally:
        leave_all(ex, [spec])
