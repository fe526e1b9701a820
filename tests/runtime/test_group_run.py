"""Three reference GRPO jobs in one group reach their solo weights bit for bit."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import assert_same_as_solo, leave_all, members
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.runtime.timeline import busy_fraction
from weave_slurm.vocab import Phase, Pool

pytestmark = pytest.mark.torch

STEPS = 3


def test_three_members_match_their_solo_runs(local_fleet: object) -> None:
    specs = members(3, STEPS, "g")
    ex = GroupRunner(local_fleet.layout, specs)  # type: ignore[attr-defined]
    try:
        ex.run(timeout_s=240)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3
        for spec in specs:
            assert_same_as_solo(ex, spec)
        # on-policy barrier: per member, rollout and train strictly alternate
        for spec in specs:
            kinds = [s.kind for s in sorted(ex.spans, key=lambda s: s.start_s)
                     if s.job_id == spec.job_id and s.kind is not Phase.SYNC]
            assert kinds == [Phase.TRAIN] + [Phase.ROLLOUT, Phase.TRAIN] * STEPS
        # the pools were shared: another member's phase ran while one member waited
        train_jobs = {s.job_id for s in ex.spans if s.pool is Pool.TRAIN}
        assert train_jobs == {s.job_id for s in specs}
        start = min(s.start_s for s in ex.spans)
        end = max(s.end_s for s in ex.spans)
        names = [n.name for n in ex.layout.rollout]
        assert 0.0 < busy_fraction(ex.spans, Pool.ROLLOUT, names, start, end) <= 1.0
        profile = ex.profiler.snapshot()
        assert len(profile["g0"].rollout_s) == STEPS
        assert profile["g0"].train_state_bytes > profile["g0"].rollout_state_bytes > 0
        assert profile["g0"].sync_bytes["weights"] > 0
    finally:
        leave_all(ex, specs)
