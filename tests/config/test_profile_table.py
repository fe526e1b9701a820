"""The ``[profile]`` table of a job spec (weave_slurm/config/profile_table.py)."""

from __future__ import annotations

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.job_codec import spec_from_json, spec_to_json
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import default_site
from weave_slurm.daemon.records import profile_from_json, profile_to_json
from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import profile_job

#: a spec whose ``[profile]`` table is last, its keys left out (each test adds its own)
SPEC = job_spec_toml("j", rollout_s=None, train_s=None, rollout_state_gib=None,
                     train_state_gib=None) + "[profile]\n"


def test_measured_values_are_read_and_the_width_curve_sorted_by_gpus() -> None:
    job = parse_job(SPEC + "rollout_s = {samples = [90, 110]}\ntrain_s = 80\n"
                           "rollout_width_s = {8 = 50.0, 2 = 160.0, 4 = 85.5}\n")
    assert (job.profile.rollout.mean_s, job.profile.rollout.max_s) == (100, 110)  # type: ignore[union-attr]
    assert job.profile.train.max_s == 80                                          # type: ignore[union-attr]
    assert job.profile.rollout_width_s == ((2, 160.0), (4, 85.5), (8, 50.0))


@pytest.mark.parametrize(("value", "words"), [
    ("{x = 1.0, 2 = 3.0}", r"key 'profile.rollout_width_s.x' = 'x': keys are GPU counts"),
    ("{0 = 1.0, 2 = 3.0}", r"key 'profile.rollout_width_s.0' = '0': keys are GPU counts"),
    ("{1 = -1.0, 2 = 3.0}", r"key 'profile.rollout_width_s.1' = -1"),
    ("{4 = 10.0}", r"key 'profile.rollout_width_s': give the rollout's time on at least two"),
    ("12", r"profile.rollout_width_s"),
])
def test_a_bad_width_curve_is_refused_naming_its_key(value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_job(SPEC + f"rollout_width_s = {value}\n")


def test_an_unknown_profile_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"profile\.rollout_widths"):
        parse_job(SPEC + "rollout_widths = 3\n")


def test_the_width_curve_survives_the_stored_spec_and_profile() -> None:
    """weaved stores the parsed spec and the profile as JSON (tuples come back tuples)."""
    job = parse_job(SPEC + "rollout_width_s = {8 = 50.0, 2 = 160.0, 4 = 85.5}\n")
    assert spec_from_json(spec_to_json(job)) == job
    prof = profile_job(job, default_site())
    assert profile_from_json(profile_to_json(prof)) == prof
