"""The fake engine of the device tests keeps vLLM's sleep/wake contract: a sleeping
engine refuses to generate, a level-1 sleep gives the same weights back, a level-2
one gives garbage until the weights are loaded."""

from __future__ import annotations

import pytest
import torch

from tests.harness.sleepy_engine import SleepyEngine
from weave_slurm.errors import ConfigError, StateError

pytestmark = pytest.mark.torch


def _engine() -> tuple[SleepyEngine, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    module = torch.nn.Linear(8, 8)
    engine = SleepyEngine(module)
    engine.remember_shapes()
    return engine, {k: v.detach().clone() for k, v in module.named_parameters()}


def test_level_one_keeps_the_weights_on_the_host() -> None:
    engine, weights = _engine()
    assert engine.sleep(1) == sum(v.numel() * 4 for v in weights.values())
    with pytest.raises(StateError, match="sleeps"):
        engine.check_awake()
    assert all(p.numel() == 0 for p in engine.module.parameters())
    engine.wake_up(["weights"])
    with pytest.raises(StateError, match="kv_cache"):
        engine.check_awake()
    engine.wake_up()
    engine.check_awake()
    assert all(torch.equal(p, weights[k]) for k, p in engine.module.named_parameters())


def test_level_two_needs_the_weights_loaded_again() -> None:
    engine, weights = _engine()
    assert engine.sleep(2) == 0
    with pytest.raises(StateError, match="wake_up"):
        engine.load_weights(weights)
    engine.wake_up()
    assert all(torch.isnan(p).all() for p in engine.module.parameters())
    with pytest.raises(StateError, match="without load_weights"):
        engine.check_awake()
    engine.load_weights(weights)
    engine.check_awake()
    assert all(torch.equal(p, weights[k]) for k, p in engine.module.named_parameters())
    with pytest.raises(ConfigError, match="valid: weights, kv_cache"):
        engine.wake_up(["kv"])
