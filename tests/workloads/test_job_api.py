"""The job API: version tagging, the on-policy check, the staleness window, entry points,
the context's gang and the merge of engines' rollouts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import pytest

from weave_slurm.errors import ConfigError, StateError, VersionMismatch
from weave_slurm.workloads.api import (
    JobContext,
    JobRunner,
    RLJob,
    Role,
    Trajectories,
    TrajectoryBatch,
)
from weave_slurm.workloads.entry import BUILTINS, load_job, resolve


class CountingJob:
    """A torch-free job that records what the runner let through."""

    def __init__(self) -> None:
        self.generated: list[int] = []
        self.updates = 0
        self.weights: dict[str, Any] = {}

    def setup(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def generate(self, weights_version: int) -> Trajectories:
        self.generated.append(weights_version)
        return Trajectories({}, {"reward_mean": 0.5})

    def update(self, trajectories: Trajectories) -> Mapping[str, float]:
        self.updates += 1
        return {"loss": 1.0}

    def export_weights(self) -> dict[str, Any]:
        return dict(self.weights)

    def import_weights(self, tensors: Mapping[str, Any]) -> None:
        self.weights = dict(tensors)

    def state_tensors(self) -> dict[str, Any]:
        return {}

    def load_state(self, tensors: Mapping[str, Any]) -> None:
        pass


def _runner(staleness: int = 0, job_id: str = "a") -> JobRunner:
    return JobRunner(CountingJob(), JobContext(job_id, Role.TRAIN, 0), staleness=staleness)


def test_batches_are_tagged_and_versions_advance() -> None:
    r = _runner()
    batch = r.rollout(0)
    assert (batch.job_id, batch.weights_version) == ("a", 0)
    assert r.train(batch) == 1
    assert r.weights_version == 1
    assert r.last_train_metrics == {"loss": 1.0}


def test_stale_batch_is_refused_without_touching_the_job() -> None:
    r = _runner()
    stale = r.rollout(0)
    r.train(stale)
    with pytest.raises(VersionMismatch, match="weights version 0"):
        r.train(stale)
    assert isinstance(r.job, CountingJob) and r.job.updates == 1
    assert r.weights_version == 1


def test_future_batch_is_refused() -> None:
    r = _runner()
    future = TrajectoryBatch("a", 3, Trajectories({}))
    with pytest.raises(VersionMismatch):
        r.train(future)


def test_batch_of_another_job_is_refused() -> None:
    r = _runner()
    foreign = _runner(job_id="b").rollout(0)
    with pytest.raises(VersionMismatch, match="'b'"):
        r.train(foreign)


def test_rollout_at_a_version_not_held_is_refused() -> None:
    r = _runner()
    with pytest.raises(VersionMismatch, match="holds version 0"):
        r.rollout(1)
    assert isinstance(r.job, CountingJob) and r.job.generated == []


def test_staleness_window_accepts_k_versions_back_only() -> None:
    r = _runner(staleness=1)
    b0 = r.rollout(0)
    r.train(r.rollout(0))  # now at version 1
    assert r.accepts(b0)
    assert r.train(b0) == 2
    with pytest.raises(VersionMismatch, match=r"versions 1\.\.2"):
        r.train(b0)


def test_negative_staleness_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="staleness"):
        _runner(staleness=-1)


def test_import_weights_sets_version_and_refuses_going_back() -> None:
    r = _runner()
    r.import_weights(cast(Any, {"w": 1}), 4)
    assert r.weights_version == 4
    assert r.rollout(4).weights_version == 4
    with pytest.raises(VersionMismatch, match="older"):
        r.import_weights(cast(Any, {"w": 0}), 3)


def test_role_parse_lists_choices() -> None:
    assert Role.parse("rollout") is Role.ROLLOUT
    with pytest.raises(ConfigError, match="rollout, train"):
        Role.parse("inference")


def test_counting_job_satisfies_protocol() -> None:
    assert isinstance(CountingJob(), RLJob)


def test_resolve_builtins_and_dotted_paths() -> None:
    assert resolve("builtin:grpo-toy") == BUILTINS["grpo-toy"]
    assert resolve("my_pkg.jobs:Factory") == "my_pkg.jobs:Factory"
    with pytest.raises(ConfigError, match="builtin:grpo-toy"):
        resolve("builtin:nope")
    with pytest.raises(ConfigError, match="neither"):
        resolve("not a path")


def test_load_job_by_module_path() -> None:
    job = load_job(f"{__name__}:CountingJob")
    assert isinstance(job, CountingJob)


def test_load_job_rejects_non_jobs_and_missing_modules() -> None:
    with pytest.raises(ConfigError, match="lacks the RLJob methods"):
        load_job("collections:OrderedDict")
    with pytest.raises(ConfigError, match="cannot import"):
        load_job("no_such_module_xyz:Job")
    with pytest.raises(ConfigError, match="no attribute"):
        load_job("collections:NoSuchThing")


def test_builtin_loads_without_setup() -> None:
    job = load_job("builtin:grpo-toy")
    assert isinstance(job, RLJob)


# -- the context's gang ------------------------------------------------------------------

class FakeGroup:
    """What JobContext asks of a process group: its size and this process's rank."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_a_context_defaults_to_a_single_cpu_rank() -> None:
    ctx = JobContext("a", Role.TRAIN, 0)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.device, ctx.group) == (
        0, 0, 1, "cpu", None)
    assert ctx.share(8) == (0, 8)


def test_a_context_places_its_rank_in_the_gang() -> None:
    group = cast(Any, FakeGroup(2, 3))
    ctx = JobContext("a", Role.ROLLOUT, 0, rank=2, local_rank=0, world_size=3, group=group)
    assert ctx.share(8) == (6, 8)
    assert [JobContext("a", Role.ROLLOUT, 0, rank=r, world_size=3).share(8)
            for r in range(3)] == [(0, 3), (3, 6), (6, 8)]


@pytest.mark.parametrize(("fields", "needle"), [
    ({"rank": 2, "world_size": 2}, r"rank 2 \(local 0\) is outside a gang of world_size 2 "
     r"\(valid: 0\.\.1\)"),
    ({"world_size": 0}, "outside a gang of world_size 0"),
    ({"rank": -1}, "rank must be an integer >= 0, got -1"),
    ({"world_size": True}, "world_size must be an integer >= 0, got True"),
    ({"local_rank": 3, "world_size": 2, "rank": 1}, r"rank 1 \(local 3\) is outside"),
    ({"device": ""}, "device must be a device name"),
    ({"rank": 1, "world_size": 2, "group": FakeGroup(0, 2)},
     "the process group is rank 0 of 2, the context says rank 1 of 2"),
])
def test_a_context_outside_its_gang_is_a_config_error(fields: dict[str, Any],
                                                      needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        JobContext("a", Role.TRAIN, 0, **fields)


def test_the_context_sees_nested_options_as_dicts_whatever_their_form() -> None:
    from weave_slurm.config.job import parse_job
    from weave_slurm.config.render import job_spec_toml

    spec = parse_job(job_spec_toml("o", options={"engine": {"tensor_parallel_size": 2},
                                                 "layers": [1, 2], "task": "copy"}))
    seen = {"engine": {"tensor_parallel_size": 2}, "layers": [1, 2], "task": "copy"}
    for form in (spec.options, dict(spec.options),
                 json.loads(json.dumps(dict(spec.options))), seen):
        assert JobContext("a", Role.TRAIN, 0, cast(Any, form)).options == seen


# -- merging the engines' rollouts --------------------------------------------------------

def test_merge_rollouts_refuses_other_jobs_and_versions() -> None:
    r = _runner()
    with pytest.raises(VersionMismatch, match=r"jobs \['b'\] / weight versions \[0\]"):
        r.merge_rollouts([r.rollout(0), _runner(job_id="b").rollout(0)])
    mixed = [TrajectoryBatch("a", 0, Trajectories({})), TrajectoryBatch("a", 1, Trajectories({}))]
    with pytest.raises(VersionMismatch, match=r"weight versions \[0, 1\]"):
        r.merge_rollouts(mixed)
    with pytest.raises(StateError, match="no batches"):
        r.merge_rollouts([])
    with pytest.raises(StateError, match="has no export_weight_shard"):
        r.export_weight_shard()


def test_merge_rollouts_concatenates_rows_and_averages_metrics_by_default() -> None:
    torch = pytest.importorskip("torch")
    r = _runner()
    parts = [TrajectoryBatch("a", 0, Trajectories(
                 {"x": torch.arange(3), "y": torch.ones(3, 2)}, {"reward_mean": 1.0})),
             TrajectoryBatch("a", 0, Trajectories(
                 {"x": torch.arange(1), "y": torch.ones(1, 4)}, {"reward_mean": 0.0}))]
    merged = r.merge_rollouts(parts)
    assert merged.weights_version == 0 and merged.metrics == {"reward_mean": 0.75}
    assert merged.trajectories.tensors["x"].tolist() == [0, 1, 2, 0]
    assert merged.trajectories.tensors["y"].tolist()[2:] == [[1, 1, 0, 0], [1, 1, 1, 1]]
