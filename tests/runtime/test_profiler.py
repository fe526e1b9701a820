"""planning_profile: what the runtime's measurements turn into for later placement."""

from __future__ import annotations

import pytest

from weave_slurm.model.profile import simple_profile
from weave_slurm.runtime.group import DeclaredProfile
from weave_slurm.runtime.profiler import LiveProfiler, MemberProfile, planning_profile
from weave_slurm.vocab import Phase

DECLARED = simple_profile("7", 10.0, 8.0, 1.5, rollout_mean_s=5.0, rollout_state_gib=4.0,
                          train_state_gib=12.0)


def _measured(rollouts: list[float], trains: list[float], *, roll_bytes: int = 0,
              train_bytes: int = 0) -> MemberProfile:
    prof = LiveProfiler()
    prof.track("7", DeclaredProfile(DECLARED.rollout_mean_s, DECLARED.train_mean_s, 1.5))
    for r in rollouts:
        prof.phase("7", Phase.ROLLOUT, r)
    for t in trains:
        prof.phase("7", Phase.TRAIN, t)
    prof.state_bytes("7", rollout=roll_bytes or None, train=train_bytes or None)
    return prof.snapshot()["7"]


def test_nothing_until_both_phases_have_enough_samples() -> None:
    assert planning_profile(DECLARED, DECLARED, _measured([9.0, 9.0], [4.0] * 5)) is None
    assert planning_profile(DECLARED, DECLARED, _measured([9.0] * 5, [4.0, 4.0])) is None


def test_means_measured_headroom_of_the_declaration_kept() -> None:
    new = planning_profile(DECLARED, DECLARED,
                           _measured([6.0, 7.0, 8.0], [2.0, 2.0, 2.0], roll_bytes=1 << 30,
                                     train_bytes=3 << 30))
    assert new is not None
    assert new.rollout_mean_s == pytest.approx(7.0)
    # declared worst case is 2x the mean: a few samples never show the longest rollout
    assert new.rollout_max_s == pytest.approx(14.0)
    assert new.train_mean_s == pytest.approx(2.0) and new.train_max_s == pytest.approx(2.0)
    assert (new.rollout_state_gib, new.train_state_gib) == (1.0, 3.0)
    assert new.budget_s == pytest.approx(1.5 * new.solo_s)   # derived fields recomputed
    assert new.slo == DECLARED.slo and new.job_id == DECLARED.job_id


def test_a_measured_maximum_beyond_the_headroom_wins() -> None:
    new = planning_profile(DECLARED, DECLARED, _measured([5.0, 5.0, 30.0], [8.0] * 3))
    assert new is not None and new.rollout_max_s == 30.0


def test_no_update_within_tolerance_of_the_current_plan() -> None:
    measured = _measured([5.1, 4.9, 5.0], [8.2, 7.9, 8.0])
    assert planning_profile(DECLARED, DECLARED, measured) is None
    # but a drifting job is followed: the window keeps only the recent samples
    drifted = _measured([5.0] * 20 + [9.0] * 20, [8.0] * 40)
    new = planning_profile(DECLARED, DECLARED, drifted)
    assert new is not None and new.rollout_mean_s == pytest.approx(9.0)
    assert planning_profile(new, DECLARED, drifted) is None


def test_measured_device_figures_feed_the_plan() -> None:
    prof = LiveProfiler()
    prof.track("7", DeclaredProfile(DECLARED.rollout_mean_s, DECLARED.train_mean_s, 1.5))
    for _ in range(3):
        prof.phase("7", Phase.ROLLOUT, 5.0)
        prof.phase("7", Phase.TRAIN, 8.0)
    prof.device("7", Phase.TRAIN, {"device_peak_bytes": 40 << 30,
                                   "device_resident_bytes": 2 << 30})
    prof.device("7", Phase.ROLLOUT, {"device_resident_bytes": 3 << 30})
    new = planning_profile(DECLARED, DECLARED, prof.snapshot()["7"])
    assert new is not None     # only the device figures moved
    assert (new.train_gpu_peak_gib, new.train_gpu_resident_gib) == (40.0, 2.0)
    # a resident with no peak reported: the peak is at least the resident
    assert (new.rollout_gpu_peak_gib, new.rollout_gpu_resident_gib) == (3.0, 3.0)
    assert planning_profile(new, DECLARED, prof.snapshot()["7"]) is None
