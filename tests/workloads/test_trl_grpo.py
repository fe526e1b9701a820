"""The TRL adapter (weave_slurm/workloads/trl_grpo.py) with the shipped example
(``builtin:trl-grpo-tiny``): reproducible rollouts, split roles, warm state and
checkpoints that continue bit for bit in another process, strict options, refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from weave_slurm.errors import ConfigError  # noqa: E402
from weave_slurm.node.segments import weights_digest  # noqa: E402
from weave_slurm.workloads import trl_tiny  # noqa: E402
from weave_slurm.workloads.api import JobContext, JobRunner, Role  # noqa: E402
from weave_slurm.workloads.entry import start_job  # noqa: E402
from weave_slurm.workloads.trl_grpo import TrlGrpoJob, check_trl_version  # noqa: E402

pytestmark = pytest.mark.torch
ENTRY = "builtin:trl-grpo-tiny"
OPTIONS: dict[str, Any] = {"prompts_per_step": 4, "max_steps": 6, "prompts": 8}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    yield


def _runner(role: Role, seed: int = 7, options: dict[str, Any] | None = None) -> JobRunner:
    return start_job(ENTRY, JobContext("trl", role, seed, options or OPTIONS))


def _steps(train: JobRunner, roll: JobRunner, n: int) -> list[float]:
    rewards = []
    for _ in range(n):
        batch = roll.rollout(roll.weights_version)
        rewards.append(batch.metrics["reward_mean"])
        version = train.train(batch)
        roll.import_weights(train.export_weights(), version)
    return rewards


def test_rollouts_depend_only_on_seed_version_and_weights() -> None:
    a, b = _runner(Role.ROLLOUT), _runner(Role.ROLLOUT)
    assert weights_digest(a.export_weights()) == weights_digest(b.export_weights())
    first, again = a.rollout(0), b.rollout(0)
    assert sorted(first.trajectories.tensors) == ["advantages", "completion_ids",
                                                  "completion_mask", "prompt_ids", "prompt_mask"]
    assert weights_digest(first.trajectories.tensors) == weights_digest(again.trajectories.tensors)
    assert first.metrics == again.metrics and "reward_mean" in first.metrics
    other = _runner(Role.ROLLOUT, seed=8).rollout(0)
    assert weights_digest(other.trajectories.tensors) != weights_digest(first.trajectories.tensors)
    rows = first.trajectories.tensors["prompt_ids"].shape[0]
    assert rows == OPTIONS["prompts_per_step"] * trl_tiny.DEFAULTS["num_generations"]


def test_each_epoch_visits_every_prompt_once() -> None:
    job = _runner(Role.ROLLOUT).job
    assert isinstance(job, TrlGrpoJob)
    epochs = [job.prompt_rows(v) for v in range(4)]   # 8 prompts, 4 a step: 2 per epoch
    for e in (0, 2):
        assert sorted(epochs[e] + epochs[e + 1]) == list(range(8))
    assert epochs[0] + epochs[1] != epochs[2] + epochs[3]     # reshuffled each epoch


def test_warm_state_continues_bit_for_bit_in_another_process(tmp_path: Path) -> None:
    train, roll = _runner(Role.TRAIN), _runner(Role.ROLLOUT)
    _steps(train, roll, 2)
    ckpt = train.checkpoint(tmp_path / "ckpt")
    state = train.state_tensors()
    assert {k.split(".")[0] for k in state} == {"policy", "optim", "trl", "weave"}
    batch = roll.rollout(roll.weights_version)
    torch.save(dict(batch.trajectories.tensors), tmp_path / "batch.pt")
    train.train(batch)
    want = weights_digest(train.state_tensors())
    script = textwrap.dedent(f"""
        import torch
        from weave_slurm.node.segments import weights_digest
        from weave_slurm.workloads.api import JobContext, Role, Trajectories, TrajectoryBatch
        from weave_slurm.workloads.entry import start_job
        r = start_job({ENTRY!r}, JobContext("trl", Role.TRAIN, 7, {OPTIONS!r}))
        assert r.restore({str(ckpt)!r}) == 2
        t = torch.load({str(tmp_path / "batch.pt")!r}, weights_only=True)
        r.train(TrajectoryBatch("trl", 2, Trajectories(t)))
        print(weights_digest(r.state_tensors()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, check=False,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == want


def test_a_group_and_a_lone_run_see_the_same_learning_rate_schedule() -> None:
    """The LR scheduler's state is warm state: a trainer that loads it mid-run steps
    with the learning rate of the run it continues, not from the schedule's start."""
    train, roll = _runner(Role.TRAIN), _runner(Role.ROLLOUT)
    _steps(train, roll, 3)
    fresh = _runner(Role.TRAIN)
    fresh.load_state(train.state_tensors())
    batch = roll.rollout(roll.weights_version)
    train.train(batch)
    fresh.train(batch)
    assert train.last_train_metrics["learning_rate"] == fresh.last_train_metrics["learning_rate"]
    assert train.last_train_metrics["learning_rate"] < trl_tiny.DEFAULTS["learning_rate"]  # decays
    assert weights_digest(train.export_weights()) == weights_digest(fresh.export_weights())


def test_options_are_strict() -> None:
    with pytest.raises(ConfigError, match="unknown key 'lr'"):
        trl_tiny.options({"lr": 0.1})
    with pytest.raises(ConfigError, match="'max_steps' = 0: must be an integer >= 1"):
        trl_tiny.options({"max_steps": 0})
    with pytest.raises(ConfigError, match="'learning_rate' = 'x'"):
        trl_tiny.options({"learning_rate": "x"})
    assert trl_tiny.options({"learning_rate": 1})["learning_rate"] == 1


def test_the_adapter_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ConfigError, match="world_size 2"):
        TrlGrpoJob(trl_tiny.build).setup(JobContext("g", Role.TRAIN, 0, OPTIONS, rank=0,
                                                    world_size=2))
    with pytest.raises(ConfigError, match=r"not a trl\.GRPOTrainer"):
        TrlGrpoJob(lambda ctx: object()).setup(JobContext("o", Role.TRAIN, 0))

    def unbounded(ctx: JobContext) -> Any:
        tr = trl_tiny.build(ctx)
        tr.args.max_steps = -1
        return tr
    with pytest.raises(ConfigError, match="max_steps = -1"):
        TrlGrpoJob(unbounded).setup(JobContext("u", Role.TRAIN, 0, OPTIONS))
    with pytest.raises(ConfigError, match=r"trl 1\.17\.0 is installed; .* trl 1\.16\.x only"):
        check_trl_version("1.17.0")
    check_trl_version("1.16.3")


def test_importing_weave_does_not_import_trl() -> None:
    code = ("import sys, weave_slurm.workloads.entry, weave_slurm.workloads.trl_grpo, "
            "weave_slurm.workloads.trl_tiny; print('trl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_the_example_learns_its_task() -> None:
    """TRL's GRPO on the shipped example, its defaults and seed 0, through split roles:
    the batch-mean reward rises well above where it starts (~0.13; ~0.5 by step 300)."""
    train, roll = (start_job(ENTRY, JobContext("learn", role, 0, {}))
                   for role in (Role.TRAIN, Role.ROLLOUT))
    rewards = _steps(train, roll, 120)
    first, last = sum(rewards[:30]) / 30, sum(rewards[-30:]) / 30
    print(f"reward: first 30 steps {first:.3f}, last 30 {last:.3f}")
    assert first < 0.2 and last > first + 0.15, (first, last)
