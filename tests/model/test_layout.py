"""A member's layout: ranks over training nodes, engines over rollout nodes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import weave_slurm.model.perf as perf
from weave_slurm.config.job import load_job, parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import SiteConfig, default_site, load_site, parse_site
from weave_slurm.daemon.records import profile_from_json, profile_to_json
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import (
    MemberLayout,
    RolloutLayout,
    TrainLayout,
    engine_choices,
    member_layout,
    rollout_layout,
    spread,
    train_layout,
)
from weave_slurm.model.profile import profile_job

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "configs" / "jobs").glob("*.toml"))
SITES = {"default": None, "reference": ROOT / "configs" / "reference.toml",
         "example": ROOT / "configs" / "site.example.toml"}


def cpu_site(rollout_gpn: int = 2, train_gpn: int = 2) -> SiteConfig:
    """A CPU test cluster's site: few GPUs (CPU slots) per node."""
    return parse_site(f"""
[pools.rollout]
partition = "h20"
gpus_per_node = {rollout_gpn}
[pools.train]
partition = "h800"
gpus_per_node = {train_gpn}
""", "cpu-site.toml")


def job(**kw: object) -> str:
    """A spec of 8 + 8 GPUs unless ``kw`` says otherwise."""
    return job_spec_toml("lay", **{"rollout_gpus": 8, "train_gpus": 8, **kw})  # type: ignore[arg-type]


def test_sixteen_gpus_on_eight_gpu_nodes_are_two_nodes_of_eight_ranks() -> None:
    lay = train_layout(16, 8)
    assert lay == TrainLayout((8, 8)) and (lay.nodes, lay.ranks) == (2, 16)
    assert lay.ranks_on(0) == range(0, 8) and lay.ranks_on(1) == range(8, 16)
    assert lay.words() == "2x8 ranks"


def test_cpu_site_four_gpu_job_is_two_nodes_of_two_ranks() -> None:
    spec = parse_job(job(rollout_gpus=4, train_gpus=4, engine_gpus=2))
    lay = member_layout(spec, cpu_site())
    assert lay.train == TrainLayout((2, 2))
    assert lay.rollout == RolloutLayout(2, (1, 1))   # one 2-GPU engine per 2-GPU node
    prof = profile_job(spec, cpu_site())
    assert (prof.train_nodes, prof.rollout_nodes, prof.layout) == (2, 2, lay)


def test_engines_of_two_over_four_rollout_gpus_are_two_engines() -> None:
    lay = rollout_layout(4, 8, 2)
    assert (lay.engines, lay.nodes, lay.engines_per_node, lay.gpus) == (2, 1, (2,), 4)
    assert lay.engines_on(0) == range(2) and lay.words() == "1x2 engines x 2 GPUs"
    assert rollout_layout(16, 8, 2).engines_per_node == (4, 4)
    assert rollout_layout(16, 8, 2).engines_on(1) == range(4, 8)


def test_uneven_counts_spread_over_the_fewest_nodes() -> None:
    assert spread(12, 2) == (6, 6) and spread(9, 2) == (5, 4) and spread(1, 1) == (1,)
    assert train_layout(12, 8) == TrainLayout((6, 6))
    assert train_layout(9, 8).words() == "5+4 ranks"
    assert train_layout(3, 8) == TrainLayout((3,))
    assert rollout_layout(12, 8, 2).engines_per_node == (3, 3)


@pytest.mark.parametrize(("gpus", "per_node", "valid"), [
    (4, 8, (1, 2, 4)), (8, 8, (1, 2, 4, 8)), (16, 8, (1, 2, 4, 8)), (4, 2, (1, 2)),
    # 24 GPUs take 3 nodes of 8; engines of 3 (2 per node) or 6 (1 per node) would need 4
    (24, 8, (1, 2, 4, 8)), (6, 8, (1, 2, 3, 6))])
def test_engine_choices(gpus: int, per_node: int, valid: tuple[int, ...]) -> None:
    assert engine_choices(gpus, per_node) == valid
    for t in valid:   # every valid size fits the nodes the rollout GPUs take
        assert rollout_layout(gpus, per_node, t).nodes == math.ceil(gpus / per_node)


@pytest.mark.parametrize(("gpus", "per_node", "engine", "valid"), [
    (4, 8, 3, "1, 2, 4"),          # does not divide the rollout GPUs
    (16, 8, 16, "1, 2, 4, 8"),     # larger than a node
    (24, 8, 3, "1, 2, 4, 8"),      # its engines do not fit the rollout's 3 nodes
    (4, 2, 4, "1, 2")])
def test_bad_engine_sizes_are_refused_in_one_line(gpus: int, per_node: int, engine: int,
                                                  valid: str) -> None:
    spec = parse_job(job(rollout_gpus=gpus, engine_gpus=engine), "bad.toml")
    with pytest.raises(ConfigError) as err:
        member_layout(spec, cpu_site(rollout_gpn=per_node, train_gpn=8))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("bad.toml: key 'gpus.engine' = ")
    assert msg.endswith(f"valid: {valid}")


def test_spec_key_is_an_integer_of_at_least_one() -> None:
    for bad in ("0", '"2"', "1.5", "true"):
        text = job().replace("[gpus]\n", f"[gpus]\nengine = {bad}\n")
        with pytest.raises(ConfigError, match=r"gpus\.engine"):
            parse_job(text)
    assert parse_job(job()).engine_gpus is None
    assert parse_job(job(engine_gpus=4)).engine_gpus == 4


def test_options_tensor_parallel_size_is_the_engine_size() -> None:
    site = default_site()
    tp = {"engine": {"tensor_parallel_size": 4}}
    assert member_layout(parse_job(job(options=tp)), site).rollout.engine_gpus == 4
    old = {"vllm": {"tensor_parallel_size": 2}}   # the table's older name
    assert member_layout(parse_job(job(options=old)), site).rollout.engine_gpus == 2
    same = parse_job(job(options=tp, engine_gpus=4))
    assert member_layout(same, site).rollout == RolloutLayout(4, (2,))
    # taken from the options, checked against the site like the key itself
    with pytest.raises(ConfigError, match=r"key 'options\.engine\.tensor_parallel_size' = 3"):
        member_layout(parse_job(job(options={"engine": {"tensor_parallel_size": 3}})), site)
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        member_layout(parse_job(job(options={"engine": {"tensor_parallel_size": "2"}})),
                      site)


def test_a_conflict_between_the_key_and_the_options_is_refused() -> None:
    spec = parse_job(job(engine_gpus=2, options={"engine": {"tensor_parallel_size": 4}}),
                     "c.toml")
    with pytest.raises(ConfigError) as err:
        member_layout(spec, default_site())
    assert str(err.value) == (
        "c.toml: key 'gpus.engine' = 2 but 'options.engine.tensor_parallel_size' = 4: both "
        "are the GPUs per rollout engine; give one, or the same value")


def test_default_engine_holds_the_weights_in_half_its_hbm() -> None:
    site = default_site()   # H20: 96 GiB; 32B bf16 weights are 59.6 GiB
    assert member_layout(parse_job(job(params_b=0.5)), site).rollout.engine_gpus == 1
    assert member_layout(parse_job(job(params_b=32)), site).rollout.engine_gpus == 2
    assert member_layout(parse_job(job(params_b=70)), site).rollout.engine_gpus == 4
    # none fits: the largest an engine may be (a node), not a split over nodes
    assert member_layout(parse_job(job(params_b=1000, rollout_gpus=16)),
                         site).rollout.engine_gpus == 8
    # 6 GPUs: 3 divides them where the power of two (4) would not
    assert member_layout(parse_job(job(params_b=70, rollout_gpus=6)),
                         site).rollout.engine_gpus == 3


def test_layout_json_round_trip_and_stored_profile() -> None:
    lay = MemberLayout(TrainLayout((6, 5)), RolloutLayout(2, (3, 3)))
    assert MemberLayout.from_json(lay.to_json()) == lay
    assert lay.words() == "train 6+5 ranks; rollout 2x3 engines x 2 GPUs"
    prof = profile_job(parse_job(job(rollout_gpus=16, train_gpus=16, engine_gpus=2)),
                       default_site())
    assert profile_from_json(profile_to_json(prof)) == prof
    assert prof.layout == MemberLayout(TrainLayout((8, 8)), RolloutLayout(2, (4, 4)))
    old = profile_to_json(prof).replace('"layout": ', '"layout_": ')   # a row before layouts
    assert profile_from_json(old).layout is None


def _site(name: str) -> SiteConfig:
    path = SITES[name]
    return default_site() if path is None else load_site(path)


@pytest.mark.parametrize("site_name", sorted(SITES))
@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_profiles_of_the_shipped_jobs_keep_their_numbers(path: Path, site_name: str) -> None:
    """Node counts as ``ceil(gpus / gpus_per_node)`` gave them before layouts, state per
    node as before, and the rollout model's replica size as its own choice was."""
    site, spec = _site(site_name), load_job(path)
    prof = profile_job(spec, site)
    assert prof.rollout_nodes == math.ceil(spec.rollout_gpus / site.rollout.gpus_per_node)
    assert prof.train_nodes == math.ceil(spec.train_gpus / site.train.gpus_per_node)
    assert prof.layout is not None
    assert (prof.layout.rollout.nodes, prof.layout.train.nodes) == (prof.rollout_nodes,
                                                                    prof.train_nodes)
    assert prof.layout.train.ranks == spec.train_gpus
    assert prof.layout.rollout.gpus == spec.rollout_gpus
    est = perf.estimate_rollout(spec, site.rollout.gpu, spec.rollout_gpus, site.model)
    assert prof.layout.rollout.engine_gpus == est.tensor_parallel
    if spec.profile.rollout is None:
        assert prof.rollout_max_s == est.max_s
    if spec.profile.rollout_state_gib is None:
        assert prof.rollout_state_gib == est.state_gib_per_gpu * min(
            spec.rollout_gpus, site.rollout.gpus_per_node)
    if spec.profile.train_state_gib is None:
        assert prof.train_state_gib == perf.train_state_gib(spec) / prof.train_nodes


def test_more_nodes_than_a_pool_has_is_refused_before_any_layout_is_built() -> None:
    """10**20 GPUs: one line naming the key, at once (no tuple of 10**19 nodes)."""
    from weave_slurm.errors import InfeasibleRequest

    for role in ("rollout", "train"):
        spec = parse_job(job(**{f"{role}_gpus": 10**20}), "big.toml")
        with pytest.raises(InfeasibleRequest) as err:
            member_layout(spec, default_site())
        assert str(err.value) == (f"big.toml: key 'gpus.{role}' needs {10**20 // 8} nodes "
                                  f"but pool '{role}' ({'h20' if role == 'rollout' else 'h800'}"
                                  ") has max_nodes=41")


def test_a_rank_or_engine_is_placed_on_its_node_and_gpus() -> None:
    train = train_layout(12, 8)   # 6 + 6
    assert [train.place(r) for r in (0, 5, 6, 11)] == [(0, 0), (0, 5), (1, 0), (1, 5)]
    roll = rollout_layout(16, 8, 2)   # 4 engines of 2 GPUs on each of 2 nodes
    assert roll.place(0) == (0, range(0, 2)) and roll.place(3) == (0, range(6, 8))
    assert roll.place(4) == (1, range(0, 2)) and roll.place(7) == (1, range(6, 8))
    for lay, what, n in ((train, "rank", 12), (roll, "engine", 8)):
        with pytest.raises(ConfigError, match=rf"{what} {n} is outside a layout of {n} "
                                              rf"{what}s; valid: 0\.\.{n - 1}"):
            lay.place(n)
        with pytest.raises(ConfigError):
            lay.place(-1)
