"""Parsing squeue output captured from the live Slurm 22.05 cluster (fixtures/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weave_slurm.errors import StateError
from weave_slurm.slurm.backend import (
    DEFAULT_INSTANCE,
    AllocationState,
    AllocationTag,
    group_comment,
    parse_comment,
)
from weave_slurm.slurm.squeue import gpus_per_node, job_state, parse_jobs, parse_steps

FIX = Path(__file__).parent / "fixtures"


def test_het_components_merge_into_one_allocation() -> None:
    allocs = {a.alloc_id: a for a in parse_jobs((FIX / "squeue_22.05_het.json").read_text())}
    het = allocs["3"]
    assert het.heterogeneous
    assert het.name == "weave-g8-het"
    assert (het.group_id, het.pool) == ("8", "het")
    assert [c.partition for c in het.components] == ["h20", "h800"]
    assert het.components[0].nodes == ("h20-0",)
    assert (het.components[0].gpu_type, het.components[0].gpus_per_node) == ("h20", 4)
    assert het.components[1].nodes == ("h800-1",)
    assert het.state is AllocationState.RUNNING
    assert "4" not in allocs, "the second het component must not be its own allocation"


def test_plain_jobs_states_and_nodes() -> None:
    allocs = {a.alloc_id: a for a in parse_jobs((FIX / "squeue_22.05_het.json").read_text())}
    assert allocs["1"].state is AllocationState.ENDED
    assert allocs["1"].nodes == ("h20-0", "h20-1")
    assert allocs["2"].state is AllocationState.RUNNING
    assert allocs["2"].components[0].cpus == 4
    assert allocs["2"].group_id is None, "comment 'weave-group=g7' lacks the pool"


def test_prefix_filters_by_job_name() -> None:
    text = (FIX / "squeue_22.05_ended.json").read_text()
    assert {a.alloc_id for a in parse_jobs(text)} == {"1", "2", "3", "5", "6", "7"}
    assert {a.alloc_id for a in parse_jobs(text, "weave-")} == {"1", "2", "3"}
    assert all(a.state is AllocationState.ENDED for a in parse_jobs(text))


def test_defensive_against_other_schemas() -> None:
    doc = {"jobs": [
        {"job_id": {"set": True, "number": 11}, "name": "weave-g1-h20",
         "job_state": ["RUNNING", "COMPLETING"], "comment": group_comment("1", "h20"),
         "tres_per_node": "gres/gpu:h20=8", "nodes": "h20-[0-1]", "partition": "h20",
         "cpus": {"set": True, "number": 16}},
        {"name": "no id"},
        "not a job",
    ]}
    (alloc,) = parse_jobs(json.dumps(doc))
    assert alloc.alloc_id == "11"
    assert alloc.state is AllocationState.RUNNING
    assert alloc.components[0].gpus_per_node == 8 and alloc.components[0].cpus == 16


def test_not_json_is_a_state_error() -> None:
    with pytest.raises(StateError, match="squeue --json"):
        parse_jobs("squeue: error: slurm_load_jobs error")


@pytest.mark.parametrize(("raw", "state"), [
    ("PENDING", AllocationState.PENDING), ("RUNNING", AllocationState.RUNNING),
    ("COMPLETING", AllocationState.ENDING), ("CANCELLED", AllocationState.ENDED),
    ("TIMEOUT", AllocationState.ENDED), (["PENDING"], AllocationState.PENDING),
    (None, AllocationState.ENDED),
])
def test_job_state_folding(raw: object, state: AllocationState) -> None:
    assert job_state(raw) is state


@pytest.mark.parametrize(("tres", "want"), [
    ("gres:gpu:h20:8", ("h20", 8)), ("gres/gpu:h800=4", ("h800", 4)),
    ("gres:gpu:2", (None, 2)), ("gres/gpu=3", (None, 3)), ("", (None, 0)),
    ("gres:shard:2", (None, 0)),
])
def test_gpus_per_node(tres: str, want: tuple[str | None, int]) -> None:
    assert gpus_per_node(tres) == want


def test_steps_text() -> None:
    """An allocation is an sbatch job: its script's step (``8.batch``, named ``batch``) and
    ``extern`` are Slurm's, never listed as weave's steps."""
    steps = parse_steps((FIX / "squeue_steps_22.05.txt").read_text() + "garbage\n3+1.0|x|n1|1\n"
                        "8.batch|batch|h20-0|1\n8.extern|extern|h20-[0-1]|2\n")
    assert [(s.alloc_id, s.step_id, s.name, s.nodes, s.ntasks) for s in steps] == [
        ("8", "8.0", "roll-a", ("h20-0", "h20-1"), 2),
        ("8", "8.1", "node-d", ("h20-0",), 1),
        ("3", "3+1.0", "x", ("n1",), 1),
    ]


def test_comment_round_trip_and_old_comments() -> None:
    assert group_comment("t1.4", "h20-0", "t1") == "weave:t1:t1.4:h20-0"
    assert parse_comment(group_comment("g_1", "h20")) == AllocationTag(DEFAULT_INSTANCE, "g_1",
                                                                       "h20")
    assert parse_comment("weave:t1:t1.4:h20-0") == AllocationTag("t1", "t1.4", "h20-0")
    # written by weaved before instance tags: the label's "<instance>." is the instance
    assert parse_comment("weave-group=t1.4,pool=h20-0") == AllocationTag("t1", "t1.4", "h20-0")
    assert parse_comment("weave-group=8,pool=het") == AllocationTag(DEFAULT_INSTANCE, "8", "het")
    for bad in ("weave-group=7", "", "weave:t1:4", "weave:t-1:4:h20", "weave:t1:4:h20:x",
                "weave:t1:g-1:h20",
                "weave::4:h20", "user's own words"):
        assert parse_comment(bad) is None, bad


def _jobs(*rows: dict[str, object]) -> str:
    base = {"job_state": "RUNNING", "nodes": "h20-0", "partition": "h20"}
    return json.dumps({"jobs": [{**base, **r} for r in rows]})


def test_rows_are_filtered_by_uid_and_instance_tag_not_by_name() -> None:
    text = _jobs(
        {"job_id": 1, "name": "weave-g1-h20-0", "user_id": 0, "comment": "weave:default:1:h20-0"},
        {"job_id": 2, "name": "weave-g999-h20-0", "user_id": 1000, "comment": ""},
        {"job_id": 3, "name": "weave-gt1.1-h20-0", "user_id": 0, "comment": "weave:t1:t1.1:h20-0"},
        {"job_id": 4, "name": "weave-g2-h20-0", "user_id": 1000,
         "comment": "weave:default:2:h20-0"},   # another user's, claiming our tag
        {"job_id": 5, "name": "weave-g3-h20-0", "user_id": 0, "comment": "weave-group=3,pool=h20"})
    ids = lambda **kw: [a.alloc_id for a in parse_jobs(text, "weave-g", **kw)]  # noqa: E731
    assert ids() == ["1", "2", "3", "4", "5"]
    assert ids(uid=0) == ["1", "3", "5"]
    assert ids(uid=0, instance=DEFAULT_INSTANCE) == ["1", "5"]
    assert ids(uid=0, instance="t1") == ["3"]
    assert ids(uid=1000, instance=DEFAULT_INSTANCE) == ["4"]
    (mine,) = parse_jobs(text, uid=0, instance="t1")
    assert (mine.instance, mine.group_id, mine.pool) == ("t1", "t1.1", "h20-0")
    assert parse_jobs(text, uid=1000)[0].instance is None   # no weave comment
