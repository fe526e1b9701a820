"""The reference GRPO job for real: learning, determinism, split roles, warm state, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from weave_slurm.errors import ConfigError, StateError, VersionMismatch
from weave_slurm.workloads.api import VERSION_KEY, JobContext, JobRunner, Role
from weave_slurm.workloads.grpo_toy import GrpoToyJob, GrpoToyOptions

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch


def _runner(role: Role = Role.TRAIN, seed: int = 0, **options: object) -> JobRunner:
    return JobRunner(GrpoToyJob(), JobContext("toy", role, seed, dict(options)))


def _steps(r: JobRunner, n: int) -> list[float]:
    rewards = []
    for _ in range(n):
        batch = r.rollout(r.weights_version)
        rewards.append(batch.metrics["reward_mean"])
        r.train(batch)
    return rewards


def _assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_reward_rises() -> None:
    rewards = _steps(_runner(), 60)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    # a random policy over 10 digits scores ~0.1; the trained one clearly more
    assert first < 0.2
    assert last > first + 0.08, (first, last)


def test_same_seed_same_weights_bit_identical() -> None:
    a, b = _runner(seed=7), _runner(seed=7)
    _steps(a, 4)
    _steps(b, 4)
    _assert_same_weights(a.export_weights(), b.export_weights())
    c = _runner(seed=8)
    _steps(c, 4)
    assert not torch.equal(a.export_weights()["lm_head.weight"],
                           c.export_weights()["lm_head.weight"])


def test_split_roles_learn_exactly_what_one_object_learns() -> None:
    single = _runner(seed=3)
    single_rewards = _steps(single, 4)
    roll, train = _runner(Role.ROLLOUT, seed=3), _runner(Role.TRAIN, seed=3)
    split_rewards = []
    for _ in range(4):
        batch = roll.rollout(roll.weights_version)
        split_rewards.append(batch.metrics["reward_mean"])
        version = train.train(batch)
        roll.import_weights(train.export_weights(), version)
    assert split_rewards == single_rewards
    assert roll.weights_version == train.weights_version == single.weights_version == 4
    _assert_same_weights(train.export_weights(), single.export_weights())
    _assert_same_weights(roll.export_weights(), single.export_weights())


def test_rollout_without_the_new_weights_is_refused() -> None:
    roll, train = _runner(Role.ROLLOUT), _runner(Role.TRAIN)
    batch = roll.rollout(0)
    train.train(batch)
    with pytest.raises(VersionMismatch):
        roll.rollout(train.weights_version)  # weights not imported yet
    with pytest.raises(VersionMismatch):
        train.train(batch)  # the batch is now off-policy


def test_rollout_role_cannot_train() -> None:
    roll = _runner(Role.ROLLOUT)
    with pytest.raises(StateError, match="role train"):
        roll.train(roll.rollout(0))


def test_checkpoint_restore_resumes_bit_identically(tmp_path: Path) -> None:
    a = _runner(seed=5)
    _steps(a, 3)
    a.checkpoint(tmp_path / "ckpt")
    _steps(a, 3)
    b = _runner(seed=5)
    assert b.restore(tmp_path / "ckpt") == 3
    _steps(b, 3)
    assert b.weights_version == a.weights_version == 6
    _assert_same_weights(a.export_weights(), b.export_weights())
    state_a, state_b = a.state_tensors(), b.state_tensors()
    assert any(k.startswith("optim.") for k in state_a)
    _assert_same_weights(state_a, state_b)


def test_restore_refuses_other_jobs_and_missing_dirs(tmp_path: Path) -> None:
    a = _runner()
    a.checkpoint(tmp_path)
    other = JobRunner(GrpoToyJob(), JobContext("other", Role.TRAIN, 0))
    with pytest.raises(StateError, match="'toy'"):
        other.restore(tmp_path)
    with pytest.raises(StateError, match="missing meta"):
        a.restore(tmp_path / "nothing")


def test_warm_state_moves_between_objects() -> None:
    a = _runner(seed=2)
    _steps(a, 2)
    state = a.state_tensors()
    assert int(state[VERSION_KEY]) == 2
    b = _runner(seed=2)
    b.load_state({k: v.clone() for k, v in state.items()})
    assert b.weights_version == 2
    _steps(a, 1)
    _steps(b, 1)
    _assert_same_weights(a.export_weights(), b.export_weights())


def test_warm_state_of_another_seed_is_refused() -> None:
    state = _runner(seed=1).state_tensors()
    with pytest.raises(StateError, match="seed"):
        _runner(seed=2).load_state(state)


def test_export_import_round_trip() -> None:
    a = _runner(seed=4)
    _steps(a, 2)
    exported = a.export_weights()
    b = _runner(Role.ROLLOUT, seed=4)
    b.import_weights(exported, a.weights_version)
    _assert_same_weights(b.export_weights(), exported)
    # exports are copies: training on does not change what was exported
    before = exported["lm_head.weight"].clone()
    _steps(a, 1)
    assert torch.equal(exported["lm_head.weight"], before)
    with pytest.raises(StateError, match="missing"):
        b.import_weights({"lm_head.weight": before}, 5)


def test_options_are_strict() -> None:
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'"):
        GrpoToyOptions.from_mapping({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match=r"options\.group_size: expected int"):
        GrpoToyOptions.from_mapping({"group_size": "8"})
    with pytest.raises(ConfigError, match=r"options\.task"):
        GrpoToyOptions.from_mapping({"task": "sort"})
    with pytest.raises(ConfigError, match="group_size"):
        GrpoToyOptions.from_mapping({"group_size": 1})
    assert GrpoToyOptions.from_mapping({"lr": 1}).lr == 1.0


def test_borrowed_weights_are_bound_without_a_copy_and_roll_out_identically(
        tmp_path: Path) -> None:
    from weave_slurm.node.index import JobRef
    from weave_slurm.node.segments import SegmentStore

    trainer = _runner(seed=3)
    _steps(trainer, 2)
    store = SegmentStore(tmp_path / "shm")
    job = JobRef("toy", 0)
    store.put_state(job, "weights", trainer.export_weights(), version=trainer.weights_version)
    seg = store.attach_state(job, "weights")

    borrowing, copying = _runner(Role.ROLLOUT, seed=3), _runner(Role.ROLLOUT, seed=3)
    assert borrowing.import_weights(seg.tensors, trainer.weights_version, borrow=True)
    assert not copying.import_weights(seg.tensors, trainer.weights_version)
    params = dict(borrowing.job.policy.named_parameters())  # type: ignore[attr-defined]
    for name, t in seg.tensors.items():   # the parameters ARE the mapped segment
        assert params[name].data_ptr() == t.data_ptr(), name
    a = borrowing.rollout(trainer.weights_version)
    b = copying.rollout(trainer.weights_version)
    for k in a.trajectories.tensors:
        assert torch.equal(a.trajectories.tensors[k], b.trajectories.tensors[k]), k
    # generation never wrote into the shared bytes
    _assert_same_weights(dict(seg.tensors), trainer.export_weights())


def test_training_cannot_borrow_and_other_jobs_get_copies() -> None:
    trainer = _runner(seed=3)
    weights = trainer.export_weights()
    with pytest.raises(StateError, match="borrow_weights\\(\\) needs role rollout"):
        trainer.job.borrow_weights(weights)  # type: ignore[attr-defined]

    kept: dict[str, Any] = {}

    class Keeps(GrpoToyJob):            # a job without borrow support keeps references
        borrow_weights = None  # type: ignore[assignment]  # opts out of BorrowsWeights

        def import_weights(self, tensors: Any) -> None:
            kept.update(tensors)
            super().import_weights(tensors)

    runner = JobRunner(Keeps(), JobContext("toy", Role.ROLLOUT, 3, {}))
    assert not runner.import_weights(weights, 1, borrow=True)
    assert all(kept[k].data_ptr() != weights[k].data_ptr() for k in weights)
