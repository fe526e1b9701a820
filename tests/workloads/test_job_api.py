"""The job API: version tagging, the on-policy check, the staleness window, entry points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from weave_slurm.errors import ConfigError, VersionMismatch
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
