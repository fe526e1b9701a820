"""Device memory per GPU in the profile: measured ``[profile]`` figures or estimates."""

from __future__ import annotations

import dataclasses

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.site import default_site
from weave_slurm.errors import ConfigError, InfeasibleRequest
from weave_slurm.model import perf
from weave_slurm.model.profile import profile_job, simple_profile

GIB = float(1 << 30)
SPEC = """
name = "j"
algorithm = "{algo}"
[model]
params_b = {params}
layers = 28
hidden = 3584
[rollout]
prompts_per_step = 64
samples_per_prompt = 8
max_response_tokens = 8192
[gpus]
rollout = 8
train = {train}
"""


def spec(params: float = 7.6, train: int = 8, algo: str = "grpo", extra: str = "") -> str:
    return SPEC.format(params=params, train=train, algo=algo) + extra


def test_estimates_follow_the_state_sharding_activations_and_residents() -> None:
    site = default_site()
    job = parse_job(spec())
    p = profile_job(job, site)
    state = 7.6e9 * (16 + 2) / GIB / 8            # actor + reference, over 8 ranks
    act = (512 + 8192) * 2 * 28 * 3584 / GIB       # checkpointed layer inputs, one sequence
    assert p.train_gpu_peak_gib == pytest.approx(state + act + perf.DEVICE_RESIDENT_GIB)
    assert p.train_gpu_resident_gib == perf.DEVICE_RESIDENT_GIB == 1.0
    est = perf.estimate_rollout(job, site.rollout.gpu, 8, site.model, 1)
    assert p.rollout_gpu_peak_gib == pytest.approx(est.state_gib_per_gpu + 1.0)
    assert p.rollout_gpu_resident_gib == 1.0
    # twice the ranks: half the state per GPU, the same activations
    wide = profile_job(parse_job(spec(train=16)), site)
    assert wide.train_gpu_peak_gib == pytest.approx(state / 2 + act + 1.0)
    # the KV cache never takes a GPU beyond vLLM's gpu_memory_utilization
    long = profile_job(parse_job(spec(params=32.5).replace("8192", "32768")), site)
    assert long.rollout_gpu_peak_gib <= perf.HBM_UTILIZATION * 96 + 1.0 + 1e-9


def test_measured_figures_win_and_a_resident_never_exceeds_its_peak() -> None:
    p = profile_job(parse_job(spec(extra="[profile]\nrollout_gpu_peak_gib = 70\n"
                                   "rollout_gpu_resident_gib = 3.5\ntrain_gpu_peak_gib = 0.4\n")),
                    default_site())
    assert (p.rollout_gpu_peak_gib, p.rollout_gpu_resident_gib) == (70, 3.5)
    assert (p.train_gpu_peak_gib, p.train_gpu_resident_gib) == (0.4, 0.4)


@pytest.mark.parametrize(("extra", "message"), [
    ("train_gpu_peak_gib = 0", "key 'profile.train_gpu_peak_gib' = 0.0: must be > 0"),
    ("rollout_gpu_resident_gib = -1", "key 'profile.rollout_gpu_resident_gib' = -1.0: must "
     "be >= 0"),
    ('train_gpu_resident_gib = "1"', "key 'profile.train_gpu_resident_gib' = '1': must be a "
     "number"),
    ("train_gpu_peak_gib = 20\ntrain_gpu_resident_gib = 30", "key "
     "'profile.train_gpu_resident_gib' = 30.0: must be <= train_gpu_peak_gib (20)"),
    ("gpu_peak_gib = 20", "unknown key 'profile.gpu_peak_gib'; valid keys here: colo_iter_s, "
     "rollout_gpu_peak_gib, rollout_gpu_resident_gib"),
])
def test_profile_keys_are_checked_in_one_line(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_job(spec(extra=f"[profile]\n{extra}\n"), "j.toml")
    text = str(err.value)
    assert text.startswith("j.toml: ") and message in text and "\n" not in text, text


def test_a_peak_beyond_the_pools_gpu_is_refused_at_profile_time() -> None:
    site = default_site()
    with pytest.raises(InfeasibleRequest) as err:      # 72B over 8 ranks: 151 GiB of state
        profile_job(parse_job(spec(params=72), "big.toml"), site)
    assert str(err.value).startswith(
        "big.toml: job 'j': train peak train_gpu_peak_gib = ")
    assert ("GiB per GPU (estimated) exceeds hbm_gib=80 of the h800 GPUs of pool 'train' "
            "(h800); ask for more training GPUs ([gpus] train)") in str(err.value)
    assert profile_job(parse_job(spec(params=72, train=32)), site).train_gpu_peak_gib < 80
    with pytest.raises(InfeasibleRequest, match=r"job 'j': rollout peak rollout_gpu_peak_gib = "
                       r"97\.0 GiB per GPU \(measured\) exceeds hbm_gib=96 of the h20 GPUs "
                       r"of pool 'rollout'"):
        profile_job(parse_job(spec(extra="[profile]\nrollout_gpu_peak_gib = 97\n")), site)
    small = dataclasses.replace(site, train=dataclasses.replace(
        site.train, gpu=dataclasses.replace(site.train.gpu, hbm_gib=16)))
    with pytest.raises(InfeasibleRequest, match="hbm_gib=16 of the h800 GPUs"):
        profile_job(parse_job(spec()), small)


def test_traces_and_simple_profiles_are_not_constrained() -> None:
    p = simple_profile("t", 100, 100, 1.5)
    assert (p.rollout_gpu_peak_gib, p.rollout_gpu_resident_gib, p.train_gpu_peak_gib,
            p.train_gpu_resident_gib, p.colo_gpu_peak_gib) == (0, 0, 0, 0, 0)


def test_the_colocated_figure_is_the_larger_phase_on_the_training_gpus() -> None:
    site = default_site()
    job = parse_job(spec())
    p = profile_job(job, site)
    colo = perf.estimate_rollout(job, site.train.gpu, 8, site.model)
    assert p.colo_gpu_peak_gib == pytest.approx(max(p.train_gpu_peak_gib,
                                                    colo.state_gib_per_gpu + 1.0))
