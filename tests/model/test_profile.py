from __future__ import annotations

import dataclasses

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.site import default_site
from weave_slurm.errors import InfeasibleRequest
from weave_slurm.model import perf
from weave_slurm.model.profile import profile_job

SPEC = """
name = "j"
algorithm = "{algo}"
[model]
params_b = {params}
[rollout]
prompts_per_step = 64
samples_per_prompt = 8
max_response_tokens = {tokens}
[gpus]
rollout = {rgpus}
train = 8
"""


def spec(params: float = 7, tokens: int = 8192, algo: str = "grpo", rgpus: int = 8,
         extra: str = "") -> str:
    return SPEC.format(params=params, tokens=tokens, algo=algo, rgpus=rgpus) + extra


def test_measured_profile_overrides_estimates() -> None:
    text = spec(extra="[profile]\nrollout_s = {mean = 100, max = 150}\ntrain_s = 80\n"
                "rollout_state_gib = 300\ntrain_state_gib = 200\n")
    p = profile_job(parse_job(text), default_site())
    assert (p.rollout_max_s, p.rollout_mean_s, p.train_max_s) == (150, 100, 80)
    assert (p.rollout_state_gib, p.train_state_gib) == (300, 200)
    assert p.solo_s == pytest.approx(150 + 80 + p.sync_s)
    assert p.budget_s == pytest.approx(1.5 * p.solo_s)  # the site's default SLO


def test_estimates_grow_with_model_and_response_length() -> None:
    site = default_site()
    small = profile_job(parse_job(spec(params=3, tokens=4096)), site)
    long = profile_job(parse_job(spec(params=3, tokens=16384)), site)
    big = profile_job(parse_job(spec(params=14, tokens=4096)), site)
    assert long.rollout_max_s > 2 * small.rollout_max_s
    assert big.train_max_s > 3 * small.train_max_s
    assert big.train_state_gib > small.train_state_gib
    assert small.rollout_mean_s < small.rollout_max_s


def test_training_flops_follow_6nt_and_algorithm() -> None:
    grpo = parse_job(spec(algo="grpo"))
    ppo = parse_job(spec(algo="ppo"))
    dapo = parse_job(spec(algo="dapo"))
    tokens = 64 * 8 * (512 + 4096)
    assert perf.train_flops(dapo) == pytest.approx(8 * 7e9 * tokens)  # 6NT + old log-probs
    assert perf.train_flops(grpo) == pytest.approx(10 * 7e9 * tokens)  # + reference model
    assert perf.train_flops(ppo) > perf.train_flops(grpo)  # + critic


def test_sync_is_one_copy_over_the_slow_link() -> None:
    site = default_site()
    p = profile_job(parse_job(spec(params=7, rgpus=16)), site)
    w = perf.weights_gib(7)
    assert p.sync_inter_gib == pytest.approx(w)
    assert p.sync_intra_gib == pytest.approx(w / 2)  # 2 rollout nodes: half arrives locally
    gbit = 8 * (1 << 30) / 1e9
    assert p.sync_s == pytest.approx(w * gbit / 20 + w / 2 * gbit / 400)
    assert p.rollout_nodes == 2 and p.train_nodes == 1


def test_state_beyond_host_memory_is_infeasible() -> None:
    site = default_site()
    small = dataclasses.replace(site, train=dataclasses.replace(site.train, host_mem_gib=64))
    with pytest.raises(InfeasibleRequest, match="host_mem_gib=64 of pool 'train'"):
        profile_job(parse_job(spec(params=7), "big.toml"), small)


def test_a_profile_knows_its_rollout_width() -> None:
    site = default_site()
    p = profile_job(parse_job(spec(params=7, tokens=8192, rgpus=4)), site)
    assert p.rollout_gpus == 4 and p.base_gpus(8) == 4
    assert p.rollout_replica_gpus == p.layout.rollout.engine_gpus  # type: ignore[union-attr]
    # every response decodes 8,192 tokens, each step reading 14 GB of weights
    bw = site.rollout.gpu.hbm_tbps * 1e12 * site.model.decode_bw_efficiency
    assert p.rollout_floor_s == pytest.approx(
        8192 * 7e9 * 2 / (p.rollout_replica_gpus * bw))
    assert p.width_factor(4, 8) == 1.0
    assert p.width_factor(8, 8) == pytest.approx(max(0.5, p.rollout_floor_s / p.rollout_max_s))
    assert p.width_factor(2, 8) == 2.0


def test_rollout_width_is_linear_down_to_the_weights_floor() -> None:
    assert perf.width_factor(8, 16) == 0.5
    assert perf.width_factor(8, 4) == 2.0
    assert perf.width_factor(8, 64, floor_fraction=0.3) == 0.3
    assert perf.width_factor(8, 4, floor_fraction=0.3) == 2.0
    with pytest.raises(ValueError, match="rollout width 0 GPUs"):
        perf.width_factor(8, 0)
    h20 = default_site().rollout.gpu
    assert [perf.replica_gpus(b, h20) for b in (7, 14, 32, 72)] == [1, 1, 2, 4]


def test_a_measured_width_curve_prices_the_width_instead_of_the_rule() -> None:
    """``[profile] rollout_width_s``: the rollout's seconds on 2, 4, 8 and 16 GPUs (the
    job's own: 4). Between counts the time is linear in 1 / GPUs, wider than measured no
    faster than the widest, narrower than measured linear; the floor is the widest's."""
    curve = "[profile]\nrollout_width_s = {2 = 80.0, 4 = 44.0, 8 = 26.0, 16 = 20.0}\n"
    p = profile_job(parse_job(spec(params=7, tokens=8192, rgpus=4, extra=curve)), default_site())
    assert p.rollout_width_s == ((2, 80.0), (4, 44.0), (8, 26.0), (16, 20.0))
    assert p.width_factor(4, 8) == 1.0
    assert p.width_factor(8, 8) == pytest.approx(26 / 44)     # the rule: max(0.5, floor)
    assert p.width_factor(2, 8) == pytest.approx(80 / 44)     # the rule: 2.0
    assert p.width_factor(64, 8) == pytest.approx(20 / 44)
    assert p.width_factor(1, 8) == pytest.approx(160 / 44)
    # 12 GPUs: 1/12 lies two thirds of the way from 1/8 to 1/16
    assert p.width_factor(12, 8) == pytest.approx((26 - 6 * 2 / 3) / 44)
    assert p.rollout_floor_fraction == pytest.approx(20 / 44)
    with pytest.raises(ValueError, match="rollout width 0 GPUs"):
        perf.curve_rollout_s(p.rollout_width_s, 0)
