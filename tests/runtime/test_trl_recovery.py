"""A TRL member's warm state in the real runtime: its training worker SIGKILLed in the
middle of a train phase is replaced by a fresh process that loads the TRL trainer's
state (policy, AdamW moments, LR schedule, counters) from the node's segment and
retrains the step; every member still ends with the weights of its solo run, bit for
bit (real node daemons on the LocalBackend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import kill_worker
from tests.runtime.helpers import assert_same_as_solo, each_change, leave_all
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner, RunningMember

pytest.importorskip("trl")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

ENTRY = "builtin:trl-grpo-tiny"
OPTIONS: dict[str, Any] = {"prompts_per_step": 2, "max_steps": 6}


@pytest.fixture(scope="module", autouse=True)
def _offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:    # before the module's node daemons start
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


def test_a_killed_trl_trainer_resumes_from_its_warm_state(
        local_fleet: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)                 # TRL's output_dir of the solo runs
    specs = [MemberSpec(f"t{i}", entry_point=ENTRY, seed=61 + i, steps=3, options=OPTIONS)
             for i in range(2)]
    ex = GroupRunner(local_fleet.layout, specs)  # type: ignore[attr-defined]
    killed: list[int] = []

    def kill_mid_train(member: RunningMember, change: MemberChanged) -> None:
        if member.spec.job_id == "t1" and member.state is change.state is MemberState.TRAIN \
                and member.version == 2 and not killed and member.running is not None:
            killed.append(kill_worker(member.running.node.socket_path, "t1"))

    try:
        ex.run(timeout_s=300, on_tick=each_change(ex, kill_mid_train))
        assert killed, "the test never killed a worker"
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        assert ex.members["t1"].recoveries == 1 and ex.members["t0"].recoveries == 0
        assert any(not s.ok and s.job_id == "t1" for s in ex.spans)
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        leave_all(ex, specs)
