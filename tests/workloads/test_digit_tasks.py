"""The digit tasks: targets and partial-credit rewards."""

from __future__ import annotations

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.tasks import DigitTask, TaskKind

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_rewards_per_task() -> None:
    prompts = torch.tensor([[1, 2, 3, 9]])
    assert DigitTask(TaskKind.COPY, 4).reward(prompts, torch.tensor([[1, 2, 3, 9]])).item() == 1
    assert DigitTask(TaskKind.REVERSE, 4).reward(prompts, torch.tensor([[9, 3, 0, 0]])).item() \
        == pytest.approx(0.5)
    assert DigitTask(TaskKind.INCREMENT, 4).reward(prompts, torch.tensor([[2, 3, 4, 0]])).item() \
        == 1


def test_prompts_are_seeded_digits() -> None:
    task = DigitTask(TaskKind.COPY, 5)
    a = task.sample_prompts(16, torch.Generator().manual_seed(3))
    b = task.sample_prompts(16, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert a.shape == (16, 5) and int(a.min()) >= 0 and int(a.max()) <= 9


def test_bad_task_and_length_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="copy, reverse, increment"):
        TaskKind.parse("sort")
    with pytest.raises(ConfigError, match="prompt_len"):
        DigitTask(TaskKind.COPY, 0)
