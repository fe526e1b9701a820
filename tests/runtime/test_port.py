"""The port between weaved and a group's runtime, driven as weaved drives it: command
values in, event values and member snapshots out, against scripted node daemons and a
virtual clock (no Slurm, no worker process)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.fakes import FakeTransfer
from weave_slurm.clock import VirtualClock
from weave_slurm.errors import ConfigError, StateError
from weave_slurm.hosted import contract
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import TRANSITIONS, GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.member import RunnerConfig
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import (
    Detach,
    Extend,
    Fail,
    FinalDigest,
    HandOff,
    Join,
    Leave,
    Repin,
    Retire,
    SetTurns,
    TakeHandOffs,
)
from weave_slurm.runtime.port_events import (
    Detached,
    Digested,
    Event,
    Faulted,
    HandedOff,
    MemberChanged,
    MemberEnded,
)
from weave_slurm.runtime.resume import ResumeKind
from weave_slurm.vocab import Phase, Pool

R0 = NodeRef("h20-0", Pool.ROLLOUT, Path("/nowhere/r0.sock"))
R1 = NodeRef("h20-1", Pool.ROLLOUT, Path("/nowhere/r1.sock"))
T = NodeRef("h800-0", Pool.TRAIN, Path("/nowhere/t.sock"))


class ScriptedNode:
    """A node daemon whose phases end on the next poll (unless held): a training phase
    reports the member's next version, and its node keeps that as the member's state."""

    def __init__(self, name: str, log: list[tuple[str, Op, str]]) -> None:
        self.name, self.log = name, log
        self.version: dict[str, int] = {}       # job -> its state's version here
        self.result: dict[str, dict[str, Any]] = {}
        self.held: set[str] = set()              # jobs whose phase keeps running

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        job = str(args.get("job", ""))
        self.log.append((self.name, op, job))
        if op is Op.ACTIVATE:
            train = args["phase"] == Phase.TRAIN.value
            init = str(args["entry"]).endswith(":init_train")
            version = 0 if init else self.version.get(job, 0) + 1
            self.result[job] = {"version": version} if train else {}
            if train:
                self.version[job] = version
        if op is Op.PHASE:
            if job in self.held or job not in self.result:
                return {"worker": {"state": "running"}}
            return {"worker": {"state": "exited", "result": self.result[job]}}
        if op is Op.ATTACH_INFO:
            return {"segments": {} if job not in self.version else
                    {contract.STATE: {"index": {"version": self.version[job]}}}}
        if op is Op.DIGEST:
            return {"sha256": f"digest-of-{job}-v{self.version.get(job)}"}
        return {}

    def close(self) -> None:
        pass


def _port(*rollout: NodeRef) -> tuple[GroupPort, dict[str, ScriptedNode], VirtualClock]:
    log: list[tuple[str, Op, str]] = []
    nodes = {n.name: ScriptedNode(n.name, log) for n in (R0, R1, T)}
    by_path = {n.socket_path: nodes[n.name] for n in (R0, R1, T)}
    clock = VirtualClock()
    port = GroupPort.open(GroupLayout(rollout or (R0,), (T,)), clock=clock,
                          config=RunnerConfig(recovery_backoff_s=1.0),
                          client_factory=lambda p: by_path[p])
    port.runner.transfer = FakeTransfer()
    return port, nodes, clock


def _ticks(port: GroupPort, clock: VirtualClock, n: int = 1) -> list[Event]:
    events: list[Event] = []
    for _ in range(n):
        clock.sleep(0.5)
        events += port.tick().events
    return events


def _changes(events: list[Event], job_id: str) -> list[MemberState]:
    return [e.state for e in events if isinstance(e, MemberChanged) and e.job_id == job_id]


def test_a_member_runs_to_its_end_and_each_change_is_an_event_in_order() -> None:
    port, _nodes, clock = _port()
    assert port.apply(Join(MemberSpec("a", steps=2))) == []   # joined: nothing changed yet
    events: list[Event] = []
    for _ in range(40):
        events += _ticks(port, clock)
        if port.members["a"].state is MemberState.DONE:
            break
    states = _changes(events, "a")
    assert states[0] is MemberState.READY and states[-1] is MemberState.DONE
    assert all(to in TRANSITIONS[frm] for frm, to in zip(
        [MemberState.STARTING, *states], states, strict=False))   # the table's edges only
    times = [e.at_s for e in events if isinstance(e, MemberChanged)]
    assert times == sorted(times) and times[-1] <= clock.now()   # the runtime's clock
    (ended,) = [e for e in events if isinstance(e, MemberEnded)]
    assert ended == MemberEnded("a", MemberState.DONE, "reached version 2")
    view = port.members["a"]
    assert (view.version, view.steps, view.state) == (2, 2, MemberState.DONE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.version = 3  # type: ignore[misc]
    assert port.tick().events == ()                  # drained: nothing is reported twice


def test_a_fault_is_reported_typed_and_only_its_member_recovers() -> None:
    port, _nodes, clock = _port()
    port.apply(Join(MemberSpec("a", steps=9)), Join(MemberSpec("b", steps=9)))
    _ticks(port, clock, 6)
    assert port.members["a"].version >= 1
    fault = Fault(FaultKind.WORKER_KILLED, "h20-0", Phase.ROLLOUT, evidence="test")
    events = port.apply(Fail("a", fault))
    assert Faulted("a", fault) in events
    assert _changes(events, "a") == [MemberState.RECOVERING] and not _changes(events, "b")
    events = _ticks(port, clock, 4)
    assert MemberState.READY in _changes(events, "a")          # re-admitted from v >= 1
    a, b = port.members["a"], port.members["b"]
    assert a.recoveries == 1 and b.recoveries == 0 and a.event is not None
    assert a.event.startswith("rollout on h20-0 killed: test; re-admitted from checkpoint v")


def test_a_member_handed_off_stops_at_its_step_boundary() -> None:
    port, _nodes, clock = _port()
    port.apply(Join(MemberSpec("a", steps=9)))
    _ticks(port, clock, 3)
    assert port.apply(HandOff("a")) == []
    assert port.members["a"].handoff
    handed: list[Event] = []
    for _ in range(10):
        _ticks(port, clock)
        handed += port.apply(TakeHandOffs(None, "group 1"))
        if handed:
            break
    (event,) = [e for e in handed if isinstance(e, HandedOff)]
    assert event.job_id == "a" and event.resume.kind is ResumeKind.FAILED   # no shared root
    assert port.members["a"].state is MemberState.MOVED
    assert _changes(handed, "a") == [MemberState.MOVED]


def test_the_groups_plan_changes_as_commands() -> None:
    port, _nodes, clock = _port(R0)
    port.apply(Join(MemberSpec("a", steps=9)))
    _ticks(port, clock, 3)
    with pytest.raises(ConfigError, match="h20-0: add rollout nodes"):
        port.apply(Extend((R0,)))
    port.apply(Extend((R1,)))
    assert port.layout.rollout == (R0, R1)
    port.apply(Repin("a", (1,)), SetTurns("a", 2))
    assert port.members["a"].next_rollout_nodes == (R1,) and port.members["a"].turns == 2
    with pytest.raises(StateError, match="h20-0 still serve a member"):
        port.apply(Retire(frozenset({"h20-0"})))
    for _ in range(10):                            # it moves once nothing is in flight
        _ticks(port, clock)
        if port.members["a"].repin is None:
            break
    assert port.members["a"].rollout_nodes == (R1,)
    port.apply(Retire(frozenset({"h20-0"})))
    assert port.layout.rollout == (R1,) and "h20-0" not in port.nodes_in_use()
    with pytest.raises(ConfigError):
        port.apply(SetTurns("a", 0))


def test_a_command_that_cannot_be_carried_out_raises_and_the_ones_before_stand() -> None:
    port, _nodes, _clock = _port()
    with pytest.raises(ConfigError, match="no member 'nobody'"):
        port.apply(Join(MemberSpec("a")), Leave("nobody"))
    assert port.order == ("a",)
    events = port.apply(Leave("a"))
    assert _changes(events, "a") == [MemberState.CANCELLED] and port.order == ()
    assert port.members["a"].state is MemberState.CANCELLED


def test_detach_and_final_digest_answer_with_events() -> None:
    port, nodes, clock = _port()
    port.apply(Join(MemberSpec("a", steps=1)), Join(MemberSpec("b", steps=9)))
    for _ in range(20):
        _ticks(port, clock)
        if port.members["a"].state is MemberState.DONE:
            break
    assert port.apply(FinalDigest("a")) == [Digested("a", "digest-of-a-v1")]
    events = port.apply(Detach((R0,), None))
    kinds = {e.job_id: e.resume.kind for e in events if isinstance(e, Detached)}
    assert kinds == {"a": ResumeKind.ENDED, "b": ResumeKind.WARM}   # b's training node lives
    assert ("h800-0", Op.DROP, "b") not in nodes["h800-0"].log   # nothing dropped


def test_commands_are_values() -> None:
    assert Repin("a", (1, 2)) == Repin("a", (1, 2)) and hash(Leave("a")) == hash(Leave("a"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Leave("a").job_id = "b"  # type: ignore[misc]


def test_the_timeline_read_side_counts_phases_in_flight_until_now() -> None:
    """What the metrics read of a group (its port, never its members): the spans that
    ended, and each phase still running as a span from its start to now."""
    port, _nodes, clock = _port()
    port.apply(Join(MemberSpec("a", steps=3)))
    for _ in range(20):
        _ticks(port, clock)
        if port.in_flight(clock.now()):
            break
    now = clock.now()
    (span,) = port.in_flight(now)
    assert span.job_id == "a" and span.end_s == now and span.start_s <= now
    assert port.clock is clock and all(s.end_s <= now for s in port.spans)
