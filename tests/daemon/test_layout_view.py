"""A job's layout in weaved: what the runtime's MemberSpec carries, and the status row."""

from __future__ import annotations

import dataclasses

import pytest

from tests.harness.specs import typed
from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import default_site
from weave_slurm.daemon.layout_view import RANK0_ONLY, layout_row
from weave_slurm.daemon.member_specs import member_spec
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow, MemberPlan
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.model.profile import profile_job, simple_profile
from weave_slurm.vocab import Phase


def _job(spec: str, state: JobState = JobState.RUNNING, profile: object = None) -> JobRow:
    prof = profile_job(parse_job(spec), default_site(), "9") if profile is None else profile
    return JobRow(9, 0, "u", "x", *typed(spec), "x.toml", prof, state, "", 1,  # type: ignore[arg-type]
                  0.0, 0.0, None)


def _alloc(key: int, role: str, nodes: tuple[str, ...]) -> AllocRow:
    pool = "h20" if role == "rollout" else "h800"
    return AllocRow(key=key, group_id=1, role=role, pool=f"{pool}-{key}", partition=pool,
                    node_count=len(nodes), gpus_per_node=8, gpu_type=pool, cpus_per_node=2,
                    state=AllocState.HELD, alloc_id=str(key), nodes=nodes, reason="")


WIDE = job_spec_toml("x", rollout_gpus=16, train_gpus=16, engine_gpus=2)
GROUP = GroupRow(1, "1", GroupState.ACTIVE, GroupPlan(3, 2, (MemberPlan(9, (2, 0)),)), 0.0, "")
ALLOCS = {1: [_alloc(1, "rollout", ("h20-a", "h20-b")), _alloc(2, "train", ("h800-a",
                                                                             "h800-b")),
              _alloc(3, "rollout", ("h20-c",))]}


def test_member_spec_carries_the_stored_layout() -> None:
    spec = member_spec(_job(WIDE), GROUP)
    assert spec.layout == MemberLayout(TrainLayout((8, 8)), RolloutLayout(2, (4, 4)))
    assert spec.train_nodes == (0, 1) and spec.train_node == 0   # rank 0's node runs
    assert spec.rollout_pins == (2, 0)
    assert spec.placed_ranks() == ((0, range(0, 8)), (1, range(8, 16)))
    assert spec.placed_engines() == ((2, range(0, 4)), (0, range(4, 8)))
    assert spec.engine_gpus == 2 and spec.phase_args(Phase.ROLLOUT, 0).engine_gpus == 2
    spec.validate(3, 2)
    with pytest.raises(ConfigError, match=r"train_nodes=\[0, 1\]; valid: distinct indices "
                                          r"in 0\.\.0"):
        spec.validate(3, 1)   # the group holds one training node: the layout needs two


def test_member_spec_of_a_job_stored_before_layouts_is_one_rank() -> None:
    spec = member_spec(_job(job_spec_toml("x"), profile=simple_profile("9", 4.0, 6.0, 2.0)),
                       GROUP)
    assert spec.layout is None and spec.train_nodes == (0,) and spec.engine_gpus == 1
    assert spec.placed_ranks() == ((0, range(1)),)


def test_member_spec_takes_the_turns_placement_planned() -> None:
    assert member_spec(_job(WIDE), GROUP).turns == 1
    spec = member_spec(_job(job_spec_toml("x"), profile=simple_profile("9", 4.0, 6.0, 2.0)),
                       GroupRow(1, "1", GroupState.ACTIVE, GroupPlan(
                           3, 1, (MemberPlan(9, (1,), 3),)), 0.0, ""))
    assert spec.turns == 3 and spec.rollout_pins == (1,)


def test_a_layout_that_does_not_match_the_nodes_is_refused() -> None:
    spec = member_spec(_job(WIDE), GroupRow(1, "1", GroupState.ACTIVE, GroupPlan(
        3, 2, (MemberPlan(9, (0,)),)), 0.0, ""))
    with pytest.raises(ConfigError) as err:
        spec.validate(3, 2)
    assert str(err.value) == ("member '9': rollout_pins names 1 node(s) but its layout (train "
                              "2x8 ranks; rollout 2x4 engines x 2 GPUs) has 2; valid: 2 "
                              "node(s)")


def test_layout_row_names_the_nodes_of_ranks_and_engines() -> None:
    row = layout_row(_job(WIDE), GROUP, ALLOCS, hosted=True)
    assert row is not None
    assert row["words"] == "train 2x8 ranks; rollout 2x4 engines x 2 GPUs"
    assert row["train"] == {"ranks": 16, "ranks_per_node": [8, 8], "nodes": [
        {"node": "h800-a", "ranks": [0, 7]}, {"node": "h800-b", "ranks": [8, 15]}]}
    assert row["rollout"] == {"engines": 8, "engine_gpus": 2, "engines_per_node": [4, 4],
                              "nodes": [{"node": "h20-c", "pin": 2, "engines": [0, 3]},
                                        {"node": "h20-a", "pin": 0, "engines": [4, 7]}]}
    assert row["runs"] is None   # every rank and every engine runs
    no_gangs = layout_row(_job(WIDE), GROUP, ALLOCS, hosted=True, gangs=False)
    assert no_gangs is not None and no_gangs["runs"] == RANK0_ONLY   # ... nor ranks
    ranks_only = layout_row(_job(job_spec_toml("x", rollout_gpus=1, train_gpus=16)), GROUP,
                            ALLOCS, hosted=True)
    assert ranks_only is not None and ranks_only["runs"] is None     # a gang runs whole
    assert layout_row(_job(WIDE), GROUP, ALLOCS, hosted=False)["runs"] is None  # type: ignore[index]


def test_layout_row_says_whether_a_pooled_group_may_spread_the_rollout() -> None:
    """The spec's sampling decides for the reference job (workloads/builtins.py)."""
    row = layout_row(_job(WIDE), GROUP, ALLOCS, hosted=True)
    assert row is not None and row["pooling"] == (
        "not poolable: options.sampling = 'batch': its stream depends on how the prompts "
        "are split over engines (valid for pooling: 'per_prompt')")
    per_prompt = job_spec_toml("x", rollout_gpus=16, train_gpus=16, engine_gpus=2,
                               options={"sampling": "per_prompt"})
    row = layout_row(_job(per_prompt), GROUP, ALLOCS, hosted=True)
    assert row is not None and row["pooling"] == "poolable (any width)"


def test_layout_row_before_placement_and_of_one_rank() -> None:
    pending = layout_row(_job(WIDE, JobState.PENDING), None, {}, hosted=True)
    assert pending is not None
    assert [n["node"] for n in pending["train"]["nodes"]] == [None, None]
    one = layout_row(_job(job_spec_toml("x", rollout_gpus=1, train_gpus=1)), GROUP, ALLOCS,
                     hosted=True)
    assert one is not None and one["runs"] is None and one["words"] == \
        "train 1x1 rank; rollout 1x1 engine x 1 GPU"
    old = _job(job_spec_toml("x"), profile=simple_profile("9", 4.0, 6.0, 2.0))
    assert layout_row(old, GROUP, ALLOCS, hosted=True) is None


def test_layout_row_names_a_share_by_its_node_daemon() -> None:
    """Two pins on two GPU shares of one host: each named as the runtime names it (its
    node daemon's key), so the status row tells them apart; whole nodes by the host."""
    shares = [dataclasses.replace(_alloc(k, "rollout", ("h20-a",)), gpus_per_node=4)
              for k in (1, 3)]
    group = GroupRow(1, "1", GroupState.ACTIVE, GroupPlan(2, 2, (MemberPlan(9, (1, 0)),),
                                                          rollout_gpus=4), 0.0, "")
    allocs = {1: [shares[0], ALLOCS[1][1], shares[1]]}
    row = layout_row(_job(WIDE), group, allocs, hosted=True, node_gpus=8)
    assert row is not None
    assert [n["node"] for n in row["rollout"]["nodes"]] == ["h20-a.3", "h20-a.1"]
    whole = layout_row(_job(WIDE), GROUP, ALLOCS, hosted=True, node_gpus=8)
    assert whole is not None
    assert [n["node"] for n in whole["rollout"]["nodes"]] == ["h20-c", "h20-a"]
