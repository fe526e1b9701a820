"""A cooperative member in the group runner against scripted node daemons and a virtual
clock: its processes are launched on its two nodes, a phase is granted (an external
activation) only while its process waits for it, no data moves after its phases, and a
re-pin (the group's plan moved it) leaves it where its process runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weave_slurm.clock import VirtualClock
from weave_slurm.daemon.runtime_view import member_row, outcome_words
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import FaultKind
from weave_slurm.runtime.group import GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.launch_plan import LaunchPlan
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Repin
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.vocab import Pool

PLAN = LaunchPlan((("train", "python t.py"), ("rollout", "python r.py")))


class GateNode:
    """A node daemon whose job processes wait where the test says."""

    def __init__(self, log: list[tuple[str, Op, dict[str, Any]]], name: str) -> None:
        self.log, self.name = log, name
        self.waiting: dict[str, dict[str, int]] = {}
        self.state: dict[str, str] = {}
        self.procs: dict[str, dict[str, Any]] = {}    # job -> role -> {"returncode": rc}
        self.then: dict[str, tuple[str, dict[str, Any]]] = {}  # after the next read: state, procs
        self.metrics: dict[str, float] = {"reward_mean": 0.5}  # what its turns report

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        job = str(args.get("job", ""))
        self.log.append((self.name, op, args))
        if op is Op.ACTIVATE:
            self.state[job] = "running"
            self.waiting.get(job, {}).pop(str(args.get("phase")), None)
        if op is Op.GATE and args.get("action") == "refuse":   # the process is told
            self.waiting.get(job, {}).pop(str(args.get("phase")), None)
        if op is Op.PHASE:
            reply = {"worker": {"state": self.state.get(job, "running"),
                                "result": {"metrics": dict(self.metrics)}},
                     "gate": {"waiting": dict(self.waiting.get(job, {})),
                              "procs": dict(self.procs.get(job, {}))}}
            if job in self.then:     # the process moves on between two reads
                self.state[job], self.procs[job] = self.then.pop(job)
            return reply
        return {}

    def close(self) -> None:
        pass


def _setup(steps: int = 2) -> tuple[GroupRunner, dict[str, GateNode], list[Any], VirtualClock]:
    log: list[tuple[str, Op, dict[str, Any]]] = []
    paths = {"h20-0": Path("/nowhere/r0.sock"), "h20-1": Path("/nowhere/r1.sock"),
             "h800-0": Path("/nowhere/t.sock")}
    nodes = {name: GateNode(log, name) for name in paths}
    by_path = {paths[n]: nodes[n] for n in paths}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, paths["h20-0"]),
                          NodeRef("h20-1", Pool.ROLLOUT, paths["h20-1"])),
                         (NodeRef("h800-0", Pool.TRAIN, paths["h800-0"]),))
    clock = VirtualClock()
    runner = GroupRunner(layout, [MemberSpec("c", steps=steps, launch=PLAN)], clock=clock,
                         client_factory=lambda p: by_path[p])
    return runner, nodes, log, clock


def _ops(log: list[Any], op: Op) -> list[tuple[str, dict[str, Any]]]:
    return [(node, args) for node, o, args in log if o is op]


def test_a_cooperative_member_is_granted_only_what_its_process_waits_for() -> None:
    runner, nodes, log, clock = _setup()
    runner.tick()
    assert [(n, a["role"]) for n, a in _ops(log, Op.LAUNCH)] == \
        [("h800-0", "train"), ("h20-0", "rollout")]
    assert all(a["resident"] is False for _, a in _ops(log, Op.REGISTER))
    member = runner.members["c"]
    assert member.state is MemberState.READY and member.initialised
    for _ in range(3):                       # nobody waits: nothing is granted
        clock.sleep(0.05)
        runner.tick()
    assert _ops(log, Op.ACTIVATE) == []
    nodes["h800-0"].waiting["c"] = {"train": 0}   # its train waits: the rollout comes first
    nodes["h20-0"].waiting["c"] = {"rollout": 0}
    clock.sleep(0.05)
    runner.tick()
    (node, grant), = _ops(log, Op.ACTIVATE)
    assert node == "h20-0" and grant["external"] and grant["phase"] == "rollout" \
        and grant["version"] == 0 and "entry" not in grant
    nodes["h20-0"].state["c"] = "exited"
    clock.sleep(0.05)
    runner.tick()                             # rollout 0 ended: the waiting train at 0 next
    clock.sleep(0.05)
    runner.tick()
    assert [(n, a["phase"], a["version"]) for n, a in _ops(log, Op.ACTIVATE)] == \
        [("h20-0", "rollout", 0), ("h800-0", "train", 0)]
    nodes["h800-0"].state["c"] = "exited"
    clock.sleep(0.05)
    runner.tick()
    assert member.version == 1 and member.rewards == [0.5]
    # no data moves, no checkpoint: the job syncs and keeps its own state
    assert not [o for _, o, _ in log if o in (Op.COPY, Op.CHECKPOINT, Op.PUT, Op.RESTORE)]


def test_a_repin_leaves_a_cooperative_member_where_its_process_runs() -> None:
    runner, nodes, log, clock = _setup()
    runner.tick()
    GroupPort(runner).apply(Repin("c", (1,)))   # the plan moved it to h20-1
    clock.sleep(0.05)
    runner.tick()
    member = runner.members["c"]
    assert member.repin is None and [n.name for n in member.rollout_nodes] == ["h20-0"]
    assert not [(n, o) for n, o, _ in log if o is Op.DROP]    # its rollout process lives
    nodes["h20-0"].waiting["c"] = {"rollout": 0}
    clock.sleep(0.05)
    runner.tick()
    assert [n for n, _ in _ops(log, Op.ACTIVATE)] == ["h20-0"]


def test_a_process_that_ends_right_after_its_last_phase_does_not_fail_it() -> None:
    """Its last rollout's grant ended and its process exited (status 0) before the
    runner read that end: the member goes on to train, it is not failed."""
    runner, nodes, _, clock = _setup(steps=1)
    runner.tick()
    member = runner.members["c"]
    nodes["h800-0"].waiting["c"] = {"train": 0}
    nodes["h20-0"].waiting["c"] = {"rollout": 0}
    clock.sleep(0.05)
    runner.tick()
    assert member.state is MemberState.ROLLOUT
    # between the runner's read of its phase and the next read: left its block, ended
    nodes["h20-0"].then["c"] = ("exited", {"rollout": {"returncode": 0}})
    for _ in range(3):
        clock.sleep(0.05)
        runner.tick()
    assert member.fault is None and member.state is not MemberState.FAILED, member.error
    nodes["h800-0"].state["c"] = "exited"
    nodes["h800-0"].procs["c"] = {"train": {"returncode": 0}}
    for _ in range(3):
        clock.sleep(0.05)
        runner.tick()
    assert member.version == 1 and member.state is MemberState.DONE, member.error


def _iteration(runner: GroupRunner, nodes: dict[str, GateNode], clock: VirtualClock,
               v: int) -> None:
    """Its processes wait for rollout ``v`` and train ``v``; both are granted and end."""
    for node, phase in (("h20-0", "rollout"), ("h800-0", "train")):
        nodes[node].state.pop("c", None)
        nodes[node].waiting["c"] = {phase: v}
        for _ in range(2):
            clock.sleep(0.05)
            runner.tick()
        nodes[node].state["c"] = "exited"
        clock.sleep(0.05)
        runner.tick()


def test_a_rollout_turns_report_is_kept() -> None:
    """``turn.report(reward_mean=...)`` in the rollout turn (docs/job_api.md) is the
    iteration's reward; the train's own report wins a key both turns report."""
    runner, nodes, _, clock = _setup()
    runner.tick()
    member = runner.members["c"]
    nodes["h20-0"].metrics = {"reward_mean": 0.7, "tokens": 12.0}
    nodes["h800-0"].metrics = {"loss": 0.25}
    _iteration(runner, nodes, clock, 0)
    assert member.version == 1 and member.rewards == [0.7], member.history
    nodes["h800-0"].metrics = {"reward_mean": 0.9}
    _iteration(runner, nodes, clock, 1)
    assert member.version == 2 and member.rewards == [0.7, 0.9], member.history


def _view(runner: GroupRunner) -> MemberView:
    """Member c as weaved reads it (the port's snapshot)."""
    return GroupPort(runner).members["c"]


def test_a_gate_refusal_is_the_jobs_reason() -> None:
    """The refusal's words are the job's REASON while it runs, and its failure's when
    the refused process then exits non-zero (not only in the job's own output)."""
    runner, nodes, log, clock = _setup()
    runner.tick()
    member = runner.members["c"]
    nodes["h800-0"].waiting["c"] = {"train": 1}     # no rollout at 1 ended: refused
    clock.sleep(0.05)
    runner.tick()
    (node, refuse), = [(n, a) for n, a in _ops(log, Op.GATE) if a["action"] == "refuse"]
    why = refuse["message"]
    assert node == "h800-0" and why.startswith("train at version 1 refused: "), why
    assert member_row(_view(runner))["event"] == why     # status's REASON
    nodes["h800-0"].procs["c"] = {"train": {"returncode": 1}}   # GateRefused ended it
    clock.sleep(0.05)
    runner.tick()
    assert member.state is MemberState.FAILED and member.fault is not None
    assert member.fault.kind is FaultKind.VERSION_REFUSED
    words = outcome_words(_view(runner))
    assert why in words, words   # the FAILED job's REASON
    assert "its train process on h800-0 exited with status 1" in outcome_words(_view(runner))


def test_a_member_is_done_when_its_driver_exits_after_its_iterations() -> None:
    """The End rule: its train process (a Ray driver) exited 0 after its last train
    while its rollout process (``ray start --block``) still runs: DONE, and the
    rollout process is stopped, not waited for."""
    runner, nodes, log, clock = _setup(steps=1)
    runner.tick()
    member = runner.members["c"]
    nodes["h800-0"].waiting["c"] = {"train": 0}
    nodes["h20-0"].waiting["c"] = {"rollout": 0}
    for node, state in (("h20-0", "exited"), ("h800-0", "exited")):
        clock.sleep(0.05)
        runner.tick()
        nodes[node].state["c"] = state
    nodes["h800-0"].procs["c"] = {"train": {"returncode": 0}}
    nodes["h20-0"].procs["c"] = {"rollout": {"returncode": None}}
    for _ in range(4):
        clock.sleep(0.05)
        runner.tick()
    assert member.version == 1 and member.state is MemberState.DONE, member.error
    stops = [n for n, a in _ops(log, Op.LAUNCH) if a.get("action") == "stop"]
    assert "h20-0" in stops, stops


def test_each_member_gets_both_addresses_and_a_port_range_of_its_own() -> None:
    paths = {"h20-0": Path("/nowhere/r0.sock"), "h800-0": Path("/nowhere/t.sock")}
    log: list[tuple[str, Op, dict[str, Any]]] = []
    by_path = {paths[n]: GateNode(log, n) for n in paths}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, paths["h20-0"]),),
                         (NodeRef("h800-0", Pool.TRAIN, paths["h800-0"]),))
    runner = GroupRunner(layout, [MemberSpec(j, steps=1, launch=PLAN) for j in ("c", "d")],
                         clock=VirtualClock(), client_factory=lambda p: by_path[p])
    runner.tick()
    envs = {(a["job"], a["role"]): a["env"] for _, a in _ops(log, Op.LAUNCH)}
    assert len(envs) == 4, envs
    for env in envs.values():   # nodes on weaved's own host (the local backend)
        assert env["WEAVE_TRAIN_ADDR"] == env["WEAVE_ROLLOUT_ADDR"] == \
            env["WEAVE_NODE_ADDR"] == "127.0.0.1", env
    ranges = {job: {(int(e["WEAVE_PORT_BASE"]), int(e["WEAVE_PORT_COUNT"]))
                    for (j, _), e in envs.items() if j == job} for job in ("c", "d")}
    assert all(len(r) == 1 for r in ranges.values()), ranges   # one range per member
    (c0, cn), = ranges["c"]
    (d0, _), = ranges["d"]
    assert cn >= 100 and (c0 + cn <= d0 or d0 + cn <= c0), ranges   # disjoint
