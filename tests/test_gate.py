"""The gate SDK outside weave (weave_slurm/gate.py): with no weave environment a phase
passes through, so one script runs with and without weave; a half-set environment or
a socket nobody answers at is a fault, not "outside weave". (Inside weave, against a
real node daemon: tests/node/test_gate.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm import gate
from weave_slurm.errors import ConfigError, StateError

VARS = ("WEAVE_NODE_SOCKET", "WEAVE_JOB_ID")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No weave environment, and no gate made yet in this process."""
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(gate, "_default", None)
    return monkeypatch


def test_outside_weave_a_phase_just_runs_with_its_hooks(env: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    gate.on_switch_in(lambda t: seen.append(f"in {t.phase} v{t.version}"))
    gate.on_switch_out(lambda t: seen.append(f"out {t.phase} v{t.version}"))
    for v in range(2):                              # the docs' loop, as written
        with gate.phase("rollout", version=v) as turn:
            seen.append(f"body v{v}")
            turn.report(reward_mean=0.5 * v)
        assert turn.metrics == {"reward_mean": 0.5 * v}
    assert seen == ["in rollout v0", "body v0", "out rollout v0",
                    "in rollout v1", "body v1", "out rollout v1"]
    assert isinstance(gate.connect(), gate.PassThrough)
    with pytest.raises(RuntimeError, match="boom"), gate.phase("train", version=0):
        raise RuntimeError("boom")                  # the body's error is its own
    with pytest.raises(ConfigError, match="phase 'sync'; valid: rollout, train"):
        gate.phase("sync", version=0).__enter__()   # bad input fails with or without weave


@pytest.mark.parametrize("have,lack", [VARS, VARS[::-1]])
def test_a_half_set_environment_is_a_fault(env: pytest.MonkeyPatch, have: str,
                                           lack: str) -> None:
    env.setenv(have, "/run/weave/node-x.sock" if have == VARS[0] else "17")
    with pytest.raises(ConfigError, match=f"gate: {have} is set .* but {lack} is not"):
        gate.phase("rollout", version=0)


def test_a_named_socket_nobody_answers_at_is_a_fault(env: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    env.setenv("WEAVE_NODE_SOCKET", str(tmp_path / "node-x.sock"))
    env.setenv("WEAVE_JOB_ID", "17")
    ran = []
    with pytest.raises(StateError, match=r"no node daemon at '.*node-x.sock'"), \
            gate.phase("rollout", version=0):
        ran.append("body")
    assert ran == []
