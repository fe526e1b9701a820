"""The window's pure parts: versions a rollout uses, the version log, spec checks, solo k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.hosted.contract import buffer_name, rollout_version
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.ordering import rollout_ready
from weave_slurm.runtime.staleness import BatchRecord, VersionLog
from weave_slurm.vocab import Phase


def test_rollout_uses_exactly_max_0_m_minus_k() -> None:
    assert [rollout_version(m, 0) for m in range(4)] == [0, 1, 2, 3]
    assert [rollout_version(m, 1) for m in range(4)] == [0, 0, 1, 2]
    assert [rollout_version(m, 2) for m in range(5)] == [0, 0, 0, 1, 2]
    # rollout m may start once version m - k exists, never past the last step
    assert rollout_ready(3, 2, 1, 10) and not rollout_ready(3, 1, 1, 10)
    assert rollout_ready(3, 3, 0, 10) and not rollout_ready(3, 2, 0, 10)
    assert not rollout_ready(10, 10, 1, 10)


def test_buffers_form_a_ring_of_k_plus_1() -> None:
    assert {buffer_name("weights.b", v, 1) for v in range(6)} == {"weights.b0", "weights.b1"}
    assert [buffer_name("traj.b", m, 2) for m in range(4)] == \
        ["traj.b0", "traj.b1", "traj.b2", "traj.b0"]


def test_version_log_refuses_a_batch_outside_the_window(tmp_path: Path) -> None:
    path = tmp_path / "j.versions.jsonl"
    log = VersionLog("j", 1, path)
    log.produced(0, 0, 0)
    log.produced(1, 0, 0)
    assert log.consumed(0, 0) == BatchRecord(0, 0, 0, 0)
    assert log.consumed(1, 1).consumed_at == 1
    assert log.current_staleness() == 1
    log.produced(2, 0, 1)                         # version 0 at step 2 with k = 1: too old
    with pytest.raises(StateError, match="outside the window k=1"):
        log.consumed(2, 2)
    with pytest.raises(StateError, match="no unconsumed batch of step 5"):
        log.consumed(5, 5)
    saved = VersionLog.load(path)
    assert [r.step for r in saved] == [0, 1, 2] and saved[1].consumed_at == 1
    assert json.loads(path.read_text().splitlines()[0])["staleness"] == 1
    log.rewind(1)                                 # restored to version 1: replay step 1 on
    assert [r.step for r in VersionLog.load(path)] == [0]


def test_a_batch_newer_than_existed_is_out_of_window() -> None:
    assert not BatchRecord(3, 2, 1, 3).in_window(1)
    assert BatchRecord(3, 2, 2, 3).in_window(1)
    assert not BatchRecord(3, 3, 3, 2).in_window(1)    # newer than the training's version


@pytest.mark.parametrize("bad", [-1, 9, True, "1"])
def test_member_spec_staleness_is_validated(bad: object) -> None:
    spec = MemberSpec("m", staleness=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"staleness=.*valid: 0\.\.8"):
        spec.validate(1, 1)


def test_phase_args_name_the_exact_buffers() -> None:
    spec = MemberSpec("m", staleness=1)
    roll = spec.phase_args(Phase.ROLLOUT, 3)
    assert (roll.weights, roll.version, roll.traj, roll.step) == ("weights.b0", 2, "traj.b1", 3)
    train = spec.phase_args(Phase.TRAIN, 3)
    assert (train.weights, train.version, train.traj, train.step) == ("weights", None,
                                                                      "traj.b1", 3)
    plain = MemberSpec("m").phase_args(Phase.ROLLOUT, 3)
    assert (plain.weights, plain.version, plain.traj) == ("weights", None, "traj")


@pytest.mark.torch
def test_solo_k1_is_deterministic_and_differs_from_on_policy() -> None:
    import torch

    from tests.harness.solo import run_solo

    spec = MemberSpec("s", seed=5, steps=3, staleness=1,
                      options={"prompts_per_step": 4, "group_size": 4})
    a, b = run_solo(spec), run_solo(spec)
    assert a.version == 3 and a.rewards == b.rewards
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert a.rewards[0] == a.rewards[1]          # steps 0 and 1 both roll out version 0
    on_policy = run_solo(spec, staleness=0)
    assert any(not torch.equal(a.weights[k], on_policy.weights[k]) for k in a.weights)
