"""A member's life cycle against scripted node daemons and a virtual clock: fresh
restarts in the first phase, waits for a node, adoption of warm state, and that every
state change goes through the transition table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.runtime.fakes import FakeTransfer
from weave_slurm.daemon.runtime_view import member_row
from weave_slurm.errors import NoCheckpoint, NodeGone, StateError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import (
    TRANSITIONS,
    GroupLayout,
    MemberSpec,
    MemberState,
    NodeRef,
)
from weave_slurm.runtime.member import RunnerConfig, RunningMember
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Adopt, Join
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.resume import Resume, ResumeKind
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.sync.sync_errors import AgentDidNotStart
from weave_slurm.vocab import Phase, Pool

R, T = Path("/nowhere/r.sock"), Path("/nowhere/t.sock")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def sleep_until(self, time_s: float) -> None:
        self.t = max(self.t, time_s)


class FakeNode:
    """A node daemon that does what the test scripts: a phase's worker state, errors
    to raise per op, the segments ATTACH_INFO reports."""

    def __init__(self, name: str, log: list[tuple[str, Op, str]]) -> None:
        self.name, self.log = name, log
        self.worker: dict[str, dict[str, Any]] = {}
        self.raises: dict[Op, Exception] = {}
        self.segments: dict[str, Any] = {}

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        job = str(args.get("job", ""))
        self.log.append((self.name, op, job))
        if op in self.raises:
            raise self.raises[op]
        if op is Op.ACTIVATE:
            self.worker[job] = {"state": "running"}
        if op is Op.PHASE:
            return {"worker": self.worker.get(job, {"state": "running"})}
        if op is Op.ATTACH_INFO:
            return {"segments": self.segments}
        return {}

    def close(self) -> None:
        pass


def _runner(**config: Any) -> tuple[GroupRunner, dict[Path, FakeNode], list[Any], FakeClock]:
    log: list[tuple[str, Op, str]] = []
    nodes = {R: FakeNode("h20-0", log), T: FakeNode("h800-0", log)}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, R),), (NodeRef("h800-0", Pool.TRAIN, T),))
    clock = FakeClock()
    runner = GroupRunner(layout, [], clock=clock, client_factory=lambda p: nodes[p],
                         config=RunnerConfig(**config))
    runner.transfer = FakeTransfer()
    return runner, nodes, log, clock


def _join(runner: GroupRunner, spec: MemberSpec) -> RunningMember:
    """``spec`` joins through the runtime's port; its live record."""
    GroupPort(runner).apply(Join(spec))
    return runner.members[spec.job_id]


def _adopt(runner: GroupRunner, spec: MemberSpec, resume: Resume | None = None
           ) -> RunningMember:
    """``spec`` is adopted through the runtime's port; its live record."""
    GroupPort(runner).apply(Adopt(spec, resume))
    return runner.members[spec.job_id]


def _warm(version: int) -> Resume:
    """The resume of a member whose lost rollout node's group is re-formed, seen at
    ``version`` on its kept training node."""
    return Resume(ResumeKind.WARM, "rollout node h20-9 lost",
                  readmit="rollout node h20-9 lost; re-attached on a new allocation",
                  version=version)


def _kill(node: FakeNode, job: str, returncode: int = -9) -> None:
    node.worker[job] = {"state": "killed", "returncode": returncode}


def test_killed_in_its_first_phase_starts_again_from_scratch_then_fails() -> None:
    runner, nodes, log, _clock = _runner(max_fresh_restarts=2)
    port = GroupPort(runner)
    port.apply(Join(MemberSpec("a")))
    for restart in (1, 2):
        runner.tick()                                  # init on the training node
        _kill(nodes[T], "a")
        runner.tick()                                  # killed -> recovering -> fresh start
        m = runner.members["a"]
        assert m.state is MemberState.STARTING and m.restarts == restart
        assert m.restart_note is not None and "killed by signal 9 (SIGKILL)" in m.restart_note
        assert f"restarted from scratch (no checkpoint yet, restart {restart})" in m.restart_note
        assert m.fault is None and m.recoveries == 0  # everything learned was forgotten
    assert [op for n, op, j in log if op is Op.DROP] == [Op.DROP] * 4   # both nodes, twice
    runner.tick()
    _kill(nodes[T], "a")
    runner.tick()
    assert runner.members["a"].state is MemberState.FAILED              # budget spent
    moves = [(e.state, e.why) for e in port.events() if isinstance(e, MemberChanged)]
    assert [s for s, _ in moves].count(MemberState.RECOVERING) == 2
    assert all(to in TRANSITIONS[frm] for frm, to in zip(
        [MemberState.STARTING, *[s for s, _ in moves]], [s for s, _ in moves], strict=False))


def test_a_node_gone_in_the_first_phase_is_waited_for_without_spending_restarts() -> None:
    runner, nodes, _log, clock = _runner(max_fresh_restarts=0, node_wait_s=30.0,
                                         recovery_backoff_s=1.0)
    _join(runner, MemberSpec("a"))
    nodes[T].raises[Op.REGISTER] = NodeGone("no node daemon at '/nowhere/t.sock'")
    runner.tick()
    m = runner.members["a"]
    assert m.state is MemberState.RECOVERING and m.fault is not None
    assert m.fault.kind is FaultKind.NODE_GONE and m.faults == 0
    nodes[T].raises[Op.DROP] = NodeGone("no node daemon at '/nowhere/t.sock'")
    for _ in range(3):                    # the restart waits for the node to answer
        clock.t += 5.0
        runner.tick()
        assert m.state is MemberState.RECOVERING and m.restarts == 0
    nodes[T].raises.clear()
    clock.t += 10.0
    runner.tick()
    assert m.state is MemberState.STARTING and m.restarts == 0   # no budget spent
    assert runner.members["a"].running is not None             # its init started again
    nodes[T].raises[Op.PHASE] = NodeGone("node daemon at '/nowhere/t.sock' closed the "
                                         "connection")
    nodes[T].raises[Op.DROP] = nodes[T].raises[Op.PHASE]
    for _ in range(8):
        clock.t += 5.0
        runner.tick()
    assert m.state is MemberState.FAILED
    assert m.history[-1][2].startswith("gave up after waiting 30 s for an unavailable node: "
                                       "restart of a: node daemon at"), m.history[-1]


def test_a_sync_agent_slurm_could_not_start_restarts_a_first_phase_not_fails_it() -> None:
    """Issue 33, C1: a node's slurmd stopped during a weaved restart; the sync agent's
    srun there aborts. A member with no checkpoint yet starts again from scratch (its
    REASON says why) and spends no restart: the node's fault, not the job's."""
    runner, _nodes, _log, _clock = _runner(max_fresh_restarts=0)
    m = _join(runner, MemberSpec("a"))
    runner.tick()                                       # init on the training node
    assert m.state is MemberState.STARTING and not m.initialised
    agent = AgentDidNotStart("sync agent on h20-0 (pid 7, exit 140) exited before it "
                             "could say where to meet: srun: Job step aborted")
    runner.recovery.fail(m, Fault.from_error(agent, "h20-0", Phase.TRAIN, "after"))
    assert m.state is MemberState.RECOVERING and m.fault is not None
    assert m.fault.kind is FaultKind.STEP_FAILED and m.faults == 0
    runner.tick()
    assert m.state is MemberState.STARTING and m.restarts == 0, m.history
    assert m.restart_note is not None and "srun: Job step aborted" in m.restart_note


def test_adopting_warm_state_reattaches_then_restores_the_newest_checkpoint() -> None:
    runner, nodes, log, _clock = _runner()
    nodes[T].segments = {"state": {"index": {"version": 3}}, "weights": {}}
    m = _adopt(runner, MemberSpec("a", steps=10))
    assert m.state is MemberState.RECOVERING and m.initialised
    assert m.fault is not None and m.fault.kind is FaultKind.REATTACHED
    assert {(n, op) for n, op, j in log if op is Op.DEACTIVATE} == \
        {("h20-0", Op.DEACTIVATE), ("h800-0", Op.DEACTIVATE)}
    assert m.event() == "re-attached after a weaved restart; recovering"
    runner.tick()
    assert ("h800-0", Op.RESTORE, "a") in log
    assert m.version == 3 and m.next_kind is Phase.ROLLOUT
    assert m.event() == ("re-attached after a weaved restart; re-admitted from checkpoint v3 "
                         "(recovery 1)")
    transfer = runner.transfer
    assert isinstance(transfer, FakeTransfer)
    assert transfer.copies == [("weights", "h800-0", ("h20-0",))]


def test_an_adopted_members_version_is_unknown_until_restored() -> None:
    """A member adopted with recoveries of a previous weaved (or runtime) counted: its
    version reads as unknown, never as 0, until its checkpoint is restored (status's
    ITER must not go backwards while it is re-attached)."""
    runner, nodes, _log, _clock = _runner()
    nodes[T].segments = {"state": {"index": {"version": 3}}, "weights": {}}
    m = _adopt(runner, MemberSpec("a", steps=10, recoveries=3))
    port = GroupPort(runner)
    assert m.recoveries == 3 and member_row(port.members["a"])["version"] is None
    runner.tick()
    assert m.version == 3 and member_row(port.members["a"])["version"] == 3


def test_a_warm_member_whose_training_node_is_silent_at_adoption_waits_for_it() -> None:
    """A lost rollout node's group is re-formed; its training node (kept) does not answer
    at the moment of adoption: the member waits for it and is restored from what it
    learned, instead of silently starting again from scratch."""
    runner, nodes, log, clock = _runner(recovery_backoff_s=1.0)
    nodes[T].segments = {"state": {"index": {"version": 3}}, "weights": {}}
    nodes[T].raises[Op.ATTACH_INFO] = NodeGone("node daemon at h800-0: timed out")
    m = _adopt(runner, MemberSpec("a", steps=10), _warm(3))
    assert m.state is MemberState.RECOVERING and not m.version_known
    assert not [op for _n, op, _j in log if op is Op.DROP]      # nothing of it dropped
    runner.tick()                                  # still silent: tried again later
    assert m.state is MemberState.RECOVERING and m.error is not None
    del nodes[T].raises[Op.ATTACH_INFO]
    clock.t += 60
    runner.tick()
    assert m.version == 3 and m.version_known and m.restarts == 0
    assert m.event() is not None and "re-admitted from checkpoint v3" in m.event()
    assert m.state is MemberState.ROLLOUT          # dispatched at once on the rollout node


def test_a_warm_member_whose_state_is_not_listed_at_adoption_is_never_dropped() -> None:
    """The training node answers at adoption but lists no state for it at that moment
    (issue 33's cut-off test once saw ITER go from 3 to 0): a member seen at a version
    is not dropped and started afresh; recovery restores its checkpoint."""
    runner, nodes, log, _clock = _runner()
    nodes[T].segments = {"weights": {}}   # the listing lacks its state now
    m = _adopt(runner, MemberSpec("a", steps=10), _warm(3))
    assert m.state is MemberState.RECOVERING and not m.version_known
    assert not [op for _n, op, _j in log if op is Op.DROP]      # nothing of it dropped
    nodes[T].segments = {"state": {"index": {"version": 3}}, "weights": {}}
    runner.tick()
    assert m.version == 3 and m.restarts == 0


def test_adopted_after_its_final_checkpoint_is_done() -> None:
    """weaved died after the member's last train step was checkpointed, before DONE."""
    runner, nodes, _log, _clock = _runner()
    nodes[T].segments = {"state": {"index": {"version": 4}}, "weights": {}}
    m = _adopt(runner, MemberSpec("a", steps=4))
    runner.tick()
    assert m.state is MemberState.DONE and m.version == 4
    assert runner.finished


def test_adopted_without_a_checkpoint_starts_again_from_scratch() -> None:
    runner, nodes, _log, _clock = _runner()
    nodes[T].segments = {"state": {"index": {"version": 0}}}
    nodes[T].raises[Op.RESTORE] = NoCheckpoint("job a has no checkpoint")
    m = _adopt(runner, MemberSpec("a", recoveries=2))   # two of a previous weaved
    runner.tick()
    assert m.state is MemberState.STARTING and m.restarts == 1
    assert m.recoveries == 3       # counted on across the fresh start (stored, said)
    assert m.restart_note is not None
    assert m.restart_note.startswith("weaved restarted before its first checkpoint")


def test_adopting_with_nothing_on_the_nodes_drops_leftovers_and_starts_fresh() -> None:
    runner, _nodes, log, _clock = _runner()
    m = _adopt(runner, MemberSpec("a"))
    assert m.state is MemberState.STARTING and not m.initialised
    assert {(n, op) for n, op, j in log if op is Op.DROP} == \
        {("h20-0", Op.DROP), ("h800-0", Op.DROP)}


def test_a_hung_phase_of_a_warm_member_recovers_and_words_say_hung() -> None:
    runner, nodes, _log, clock = _runner(phase_deadline_floor_s=10.0)
    nodes[T].segments = {"state": {"index": {"version": 1}}, "weights": {}}
    m = _adopt(runner, MemberSpec("a"))
    runner.tick()                                     # restored; rollout started
    assert m.state is MemberState.ROLLOUT
    clock.t += 11.0
    runner.tick()
    assert m.fault is not None and m.fault.kind is FaultKind.PHASE_HUNG
    assert m.error == "rollout on h20-0 hung: ran past its deadline of 10.0 s"
    assert m.state in (MemberState.RECOVERING, MemberState.READY, MemberState.ROLLOUT)


def test_a_move_off_the_table_is_refused() -> None:
    runner, _nodes, _log, _clock = _runner()
    m = _join(runner, MemberSpec("a"))
    with pytest.raises(StateError, match="starting -> done is not a valid transition"):
        runner.lifecycle.move(m, MemberState.DONE, "skipping ahead")


def test_a_carried_gang_moves_each_ranks_checkpoint_to_its_new_node() -> None:
    """A gang re-admitted on new training nodes after its old ones were lost: rank 0's
    checkpoint and rank 1's each come from their own old node's root."""
    from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
    from weave_slurm.runtime.resume import ResumeKind

    log: list[tuple[str, Op, str]] = []
    t2, t3 = Path("/nowhere/t2.sock"), Path("/nowhere/t3.sock")
    nodes = {R: FakeNode("h20-0", log), t2: FakeNode("h800-2", log), t3: FakeNode("h800-3", log)}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, R),),
                         (NodeRef("h800-2", Pool.TRAIN, t2), NodeRef("h800-3", Pool.TRAIN, t3)))
    runner = GroupRunner(layout, [], clock=FakeClock(), client_factory=lambda p: nodes[p])
    runner.transfer = FakeTransfer()   # type: ignore[assignment]
    spec = MemberSpec("g", train_nodes=(0, 1),
                      layout=MemberLayout(TrainLayout((1, 1)), RolloutLayout(1, (1,))))
    base = Path("/shared/ckpt")
    member = _adopt(runner, spec, Resume(ResumeKind.CARRIED, "lost", readmit="lost; moved",
                                       root=base / "h800-0", version=3,
                                       rank_roots=(base / "h800-1",)))
    adopts = [(n, j) for n, op, j in log if op is Op.ADOPT]
    assert adopts == [("h800-2", "g"), ("h800-3", "g.r1")]
    assert member.state is MemberState.RECOVERING


def test_a_checkpoint_that_cannot_be_moved_is_said_in_the_jobs_words() -> None:
    """A warning about a member (here: its checkpoint not moved to its new training node)
    is not only in weaved's log: the port's view of it carries it, so the job's REASON and
    its outcome say it (issue #30, item 5)."""
    from weave_slurm.daemon.runtime_view import member_row, outcome_words
    from weave_slurm.runtime.resume import ResumeKind

    runner, nodes, _, _ = _runner()
    nodes[T].raises[Op.ADOPT] = StateError("disk full")
    _adopt(runner, MemberSpec("a"), Resume(ResumeKind.CARRIED, "lost", readmit="lost; moved",
                                           root=Path("/shared/ckpt/h800-9"), version=3))
    view = GroupPort(runner).members["a"]
    assert view.warning == ("its checkpoint under /shared/ckpt/h800-9 could not be moved to "
                            "h800-0: disk full")
    assert f"warning: {view.warning}" in outcome_words(view)
    assert member_row(view)["event"] == (
        "its training node was lost and its last checkpoint could not be moved to the new "
        f"one; restarted from scratch; warning: {view.warning}")
