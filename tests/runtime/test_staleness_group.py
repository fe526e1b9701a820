"""A k = 1 member in a group: its version log proves the window, and it learns as alone.

Two reference GRPO jobs share one rollout and one training node daemon
(LocalBackend); the second has staleness k = 1. From the persisted version log:
every batch of step m was generated with exactly version max(0, m - k), no newer than
the newest version when its rollout started, and trained at version v = m, so
v - k <= b <= v. The k = 0 members match their solo runs bit for bit, and the k = 1
member matches a solo k = 1 run bit for bit (its result depends on its seed and its
window only, not on how the group interleaved it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, leave_all, ok_spans
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch

STEPS = 3


def test_k1_member_holds_its_window_and_matches_solo(local_fleet: object,
                                                     tmp_path: Path) -> None:
    specs = [MemberSpec("w0", seed=21, steps=STEPS, options=OPTIONS),
             MemberSpec("w1", seed=22, steps=STEPS, options=OPTIONS, staleness=1)]
    ex = GroupRunner(local_fleet.layout, specs,  # type: ignore[attr-defined]
                       config=RunnerConfig(records_dir=tmp_path))
    try:
        ex.run(timeout_s=240)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        for spec in specs:
            log = VersionLog.load(tmp_path / f"{spec.job_id}.versions.jsonl")
            assert log == ex.version_log(spec.job_id)
            assert [r.step for r in log] == list(range(STEPS))
            for rec in log:
                k = spec.staleness
                assert rec.weights_version == max(0, rec.step - k)   # exactly, not newest
                assert rec.consumed_at == rec.step
                assert rec.consumed_at - k <= rec.weights_version <= rec.consumed_at
                assert rec.weights_version <= rec.newest_version
        # the spans agree: rollout m of w1 starts after train m - 2 ended (v m-1 existed);
        # train v starts after rollout v ended
        rolls, trains = ok_spans(ex, "w1", Phase.ROLLOUT), ok_spans(ex, "w1", Phase.TRAIN)
        trains = trains[1:]   # the first is init (version 0)
        assert len(rolls) == len(trains) == STEPS
        for m in range(2, STEPS):
            assert rolls[m][0] >= trains[m - 2][1]
        for v in range(STEPS):
            assert trains[v][0] >= rolls[v][1]
        # status exposes the window and the current staleness
        rows = {r["job"]: r for r in ex.status()}
        assert (rows["w1"]["staleness"], rows["w1"]["current_staleness"]) == (1, 1)
        assert (rows["w0"]["staleness"], rows["w0"]["current_staleness"]) == (0, 0)
        for spec in specs:
            assert_same_as_solo(ex, spec)            # w1 against run_solo with k = 1
    finally:
        leave_all(ex, specs)

