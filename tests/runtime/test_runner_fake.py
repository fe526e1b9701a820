"""The executor's decisions against scripted node daemons and a virtual clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.vocab import Pool


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeNode:
    """Accepts every request; a phase stays 'running' until the test says otherwise."""

    def __init__(self, log: list[tuple[str, Op, str]], name: str) -> None:
        self.log, self.name = log, name
        self.phase_state: dict[str, str] = {}

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        job = str(args.get("job", ""))
        self.log.append((self.name, op, job))
        if op is Op.ACTIVATE:
            self.phase_state[job] = "running"
        if op is Op.PHASE:
            return {"worker": {"state": self.phase_state.get(job, "running")}}
        return {}

    def close(self) -> None:
        pass


def _layout() -> GroupLayout:
    return GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, Path("/nowhere/r.sock")),),
                       (NodeRef("h800-0", Pool.TRAIN, Path("/nowhere/t.sock")),))


def test_hung_phase_is_cancelled_at_its_deadline_and_only_its_member_recovers() -> None:
    log: list[tuple[str, Op, str]] = []
    nodes = {Path("/nowhere/r.sock"): FakeNode(log, "h20-0"),
             Path("/nowhere/t.sock"): FakeNode(log, "h800-0")}
    clock = FakeClock()
    ex = GroupRunner(_layout(), [MemberSpec("a"), MemberSpec("b")], clock=clock,
                       config=RunnerConfig(phase_deadline_floor_s=10.0, recovery_backoff_s=1.0),
                       client_factory=lambda p: nodes[p])
    ex.tick()
    assert ex.members["a"].running is not None          # a's init on the train node
    assert ex.members["b"].running is None               # one phase per node at a time
    clock.t = 9.0
    ex.tick()
    assert ex.members["a"].running is not None           # not hung yet
    clock.t = 10.5
    ex.tick()
    assert ("h800-0", Op.DEACTIVATE, "a") in log
    assert ex.members["a"].state is MemberState.FAILED   # never got warm: not re-admitted
    assert "hung" in (ex.members["a"].error or "")
    assert ex.members["b"].running is not None           # b got the node at once
    assert ex.members["b"].state is MemberState.STARTING


def test_leave_drops_the_member_on_every_node() -> None:
    log: list[tuple[str, Op, str]] = []
    nodes = {Path("/nowhere/r.sock"): FakeNode(log, "h20-0"),
             Path("/nowhere/t.sock"): FakeNode(log, "h800-0")}
    ex = GroupRunner(_layout(), [MemberSpec("a")], clock=FakeClock(),
                       client_factory=lambda p: nodes[p])
    ex.tick()
    GroupPort(ex).apply(Leave("a"))
    assert {(n, op) for n, op, j in log if j == "a" and op is Op.DROP} == \
        {("h20-0", Op.DROP), ("h800-0", Op.DROP)}
    assert ex.members["a"].state is MemberState.CANCELLED
    assert ex.finished


def test_members_taking_turns_train_in_turn_order() -> None:
    log: list[tuple[str, Op, str]] = []
    paths = (Path("/nowhere/r0.sock"), Path("/nowhere/r1.sock"), Path("/nowhere/t.sock"))
    nodes = {p: FakeNode(log, p.stem) for p in paths}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, paths[0]),
                          NodeRef("h20-1", Pool.ROLLOUT, paths[1])),
                         (NodeRef("h800-0", Pool.TRAIN, paths[2]),))
    plain = GroupRunner(layout, [MemberSpec("a", rollout_pins=(0,)),
                                 MemberSpec("b", rollout_pins=(1,))], clock=FakeClock(),
                        client_factory=lambda p: nodes[p])
    assert plain.lifecycle.turn_order == ("a", "b") and plain.lifecycle.cycling() is None
    ex = GroupRunner(layout, [MemberSpec("a", rollout_pins=(0,)),
                              MemberSpec("b", rollout_pins=(1,), turns=2)], clock=FakeClock(),
                     client_factory=lambda p: nodes[p])
    assert ex.lifecycle.turn_order == ("b", "a", "b")
    assert ex.lifecycle.cycling() == set()        # both still starting: nobody waited for
    for job in ("a", "b"):
        ex.members[job].state = MemberState.READY
    assert ex.lifecycle.cycling() == {"a", "b"}
    ex.lifecycle.set_turns("b", 1)                 # a re-plan gave b one turn again
    assert ex.lifecycle.turn_order == ("a", "b") and ex.lifecycle.cycling() is None
    with pytest.raises(ConfigError, match=r"turns=0; valid: 1\.\.16"):
        ex.lifecycle.set_turns("b", 0)
