"""A training gang's part of the runner/worker contract: every rank's phase argument
(its rank, GPU, world and owning job) round-trips through JSON, an argument written
before gangs reads as a single rank, and a rank's node-level job id."""

from __future__ import annotations

import json

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.hosted.contract import RANK_SUFFIX, PhaseArgs, rank_job

GANG_FIELDS = ("rank", "local_rank", "world_size", "init_method", "world_timeout_s", "job_id")


def test_a_ranks_arguments_round_trip() -> None:
    args = PhaseArgs("builtin:grpo-toy", 3, {"lr": 0.5, "tags": ["a"]}, staleness=1,
                     weights="weights.b1", version=4, traj="traj.b0", step=5,
                     progress="j.5.1", tail_fraction=0.1, engine_gpus=2, rank=3,
                     local_rank=1, world_size=4, init_method="tcp://10.0.0.1:29517",
                     world_timeout_s=30.5, job_id="j")
    raw = json.loads(args.encode())
    assert {k: raw[k] for k in GANG_FIELDS} == {
        "rank": 3, "local_rank": 1, "world_size": 4, "init_method": "tcp://10.0.0.1:29517",
        "world_timeout_s": 30.5, "job_id": "j"}
    got = PhaseArgs.decode([args.encode()], "test")
    assert got == args
    assert (got.rank, got.local_rank, got.world_size, got.init_method, got.world_timeout_s,
            got.job_id) == (3, 1, 4, "tcp://10.0.0.1:29517", 30.5, "j")
    assert isinstance(got.world_timeout_s, float)


def test_a_single_ranks_defaults_round_trip() -> None:
    args = PhaseArgs("builtin:grpo-toy", 0, {})
    raw = json.loads(args.encode())
    assert {k: raw[k] for k in GANG_FIELDS} == {
        "rank": 0, "local_rank": 0, "world_size": 1, "init_method": None,
        "world_timeout_s": 120.0, "job_id": None}
    assert PhaseArgs.decode([args.encode()], "test") == args


def test_an_argument_without_the_gang_fields_is_a_single_rank() -> None:
    old = json.dumps({"entry_point": "builtin:grpo-toy", "seed": 9, "options": {"n": 2},
                      "staleness": 0, "weights": "weights", "version": None,
                      "traj": "traj", "step": None, "progress": None,
                      "tail_fraction": 0.25, "engine_gpus": 1})
    got = PhaseArgs.decode([old], "test")
    assert (got.rank, got.local_rank, got.world_size, got.init_method, got.world_timeout_s,
            got.job_id) == (0, 0, 1, None, 120.0, None)
    assert got == PhaseArgs("builtin:grpo-toy", 9, {"n": 2})


def test_decode_still_wants_exactly_one_argument() -> None:
    with pytest.raises(ConfigError, match="train: expected one JSON argument, got 2"):
        PhaseArgs.decode(["{}", "{}"], "train")


@pytest.mark.parametrize(("job", "rank", "want"), [
    ("j", 0, "j"), ("j", 1, "j.r1"), ("j", 3, "j.r3"), ("rl-42.7", 12, "rl-42.7.r12")])
def test_rank_job(job: str, rank: int, want: str) -> None:
    assert rank_job(job, rank) == want


def test_rank_suffix_is_what_separates_the_rank() -> None:
    assert RANK_SUFFIX == ".r"
    assert rank_job("j", 5).removeprefix("j" + RANK_SUFFIX) == "5"


def test_engine_jobs_and_their_slices() -> None:
    from weave_slurm.hosted.contract import ENGINE_SUFFIX, engine_job, traj_part

    assert [engine_job("12", e) for e in range(3)] == ["12", "12.e1", "12.e2"]
    assert ENGINE_SUFFIX == ".e"
    assert traj_part("traj", 0, 1) == "traj"                   # one engine: the batch
    assert [traj_part("traj.b1", e, 2) for e in range(2)] == ["traj.b1.e0", "traj.b1.e1"]


def test_engines_round_trip_and_default_to_one() -> None:
    args = PhaseArgs("builtin:grpo-toy", 1, {}, engines=3)
    assert PhaseArgs.decode([args.encode()], "t").engines == 3
    assert PhaseArgs.decode([PhaseArgs("x", 1, {}).encode()], "t").engines == 1


def test_shard_sync_round_trips_and_defaults_off() -> None:
    assert PhaseArgs.decode([PhaseArgs("x", 1, {}, shard_sync=True).encode()], "t").shard_sync
    assert not PhaseArgs.decode([PhaseArgs("x", 1, {}).encode()], "t").shard_sync


def test_a_hosted_phase_tells_the_jobs_code_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase's arguments become the rank's environment (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, SLURM_PROCID ...) before the job's own code runs; the node
    daemon's step's own variables go. (The whole environment is put back afterwards:
    a RANK or MASTER_ADDR left in the test process would make every later torch job
    in it wait for a world that never forms.)"""
    import os
    from unittest import mock

    from weave_slurm.hosted.phases import _args
    from weave_slurm.node.index import JobRef
    from weave_slurm.node.resident import PhaseContext

    args = PhaseArgs("builtin:grpo-toy", 0, {}, rank=3, local_rank=1, world_size=4,
                     init_method="tcp://10.1.0.5:29500", job_id="j1")
    ctx = PhaseContext(JobRef("j1", 0), "train", (args.encode(),), {}, 1)
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "SLURM_PROCID", "SLURM_NTASKS", "SLURMD_NODENAME")
    with mock.patch.dict(os.environ, {"SLURM_STEP_ID": "7", "SLURMD_NODENAME": "h800-1"}):
        assert _args(ctx).rank == 3
        assert [os.environ[k] for k in keys] == ["3", "1", "4", "10.1.0.5", "29500", "3",
                                                "4", "h800-1"]
        assert "SLURM_STEP_ID" not in os.environ
    assert "RANK" not in os.environ or os.environ["RANK"] != "3"
