"""A member's training gang as pure logic: its rendezvous ports, its ranks and their
node-level jobs, one phase started on every rank (a fake node link), and every rank's
phase read back as one state or one fault."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from weave_slurm.errors import ConfigError, NodeGone, WeaveError
from weave_slurm.hosted.contract import PhaseArgs
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op, WorkerState
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.gang import Gang, GangPorts, RankSlot, read_phase
from weave_slurm.runtime.group import MemberSpec, NodeRef
from weave_slurm.runtime.nodes import NodeLink
from weave_slurm.vocab import Phase, Pool

FN = "weave_slurm.hosted.phases:train"
ARGS = PhaseArgs("builtin:grpo-toy", 7, {"lr": 0.1})
CODE = {"workdir": "/jobs/j"}
JOB = JobRef("j", 1000)
PORTS = GangPorts(30000, 30009)
LAYOUT = MemberLayout(TrainLayout((2, 2)), RolloutLayout(1, (1,)))


def _train(address: str | None = "10.0.0.1") -> tuple[NodeRef, NodeRef]:
    return (NodeRef("h800-0", Pool.TRAIN, Path("/run/weave/h800-0.sock"), address, 7070),
            NodeRef("h800-1", Pool.TRAIN, Path("/run/weave/h800-1.sock"), "10.0.0.2", 7070))


def _gang(address: str | None = "10.0.0.1", whole: bool = True,
          train_nodes: tuple[int, ...] = (0, 1)) -> Gang:
    spec = MemberSpec("j", train_nodes=train_nodes, layout=LAYOUT)
    return Gang.of(spec, JOB, _train(address), whole=whole)


class FakeLink(NodeLink):
    """Records every request; ``fail_at``: the n-th ACTIVATE (1-based) raises
    ``error``; ``phases``: the worker dict (or error) a PHASE of a job answers."""

    def __init__(self, fail_at: int | None = None,
                 error: WeaveError | None = None,
                 phases: dict[str, dict[str, Any] | WeaveError] | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, Op, dict[str, Any]]] = []
        self.fail_at = fail_at
        self.error = error or WeaveError("activate refused")
        self.phases = phases or {}
        self.activations = 0

    def call(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any]:
        self.calls.append(("call", node.name, op, dict(args)))
        if op is Op.ACTIVATE:
            self.activations += 1
            if self.activations == self.fail_at:
                raise self.error
            return {"pid": 100 + self.activations}
        if op is Op.PHASE:
            got = self.phases[args["job"]]
            if isinstance(got, WeaveError):
                raise got
            return {"worker": got}
        return {}

    def best_effort(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any] | None:
        self.calls.append(("best_effort", node.name, op, dict(args)))
        return {}

    def of(self, op: Op) -> list[tuple[str, str, Op, dict[str, Any]]]:
        return [c for c in self.calls if c[2] is op]


def _ranked(call: tuple[str, str, Op, dict[str, Any]]) -> PhaseArgs:
    return PhaseArgs.decode(call[3]["args"], "test")


# -- ports ---------------------------------------------------------------------------------
def test_pick_is_in_range_deterministic_and_moves_with_the_formation() -> None:
    first = PORTS.pick("j", 0, ())
    assert 30000 <= first <= 30009
    assert PORTS.pick("j", 0, ()) == first
    assert PORTS.pick("j", 1, ()) == 30000 + (first - 30000 + 1) % 10
    for job in ("a", "job-17", "x" * 40):
        for formation in range(12):
            assert 30000 <= PORTS.pick(job, formation, ()) <= 30009


def test_pick_skips_taken_ports() -> None:
    first = PORTS.pick("j", 0, ())
    after = 30000 + (first - 30000 + 1) % 10
    assert PORTS.pick("j", 0, [first]) == after
    taken = [p for p in range(30000, 30010) if p != 30004]
    assert PORTS.pick("j", 0, iter(taken)) == 30004   # any iterable, read once
    assert GangPorts(40000, 40000).pick("j", 3, [39999, 40001]) == 40000


def test_pick_with_every_port_taken_is_a_weave_error() -> None:
    with pytest.raises(WeaveError) as err:
        GangPorts(30000, 30002).pick("j", 0, [30000, 30001, 30002])
    assert type(err.value) is WeaveError
    assert str(err.value) == ("no free gang rendezvous port in 30000-30002 "
                              "(3 in use on that node)")


@pytest.mark.parametrize(("first", "last"), [(1023, 2000), (3000, 2999), (1024, 65536),
                                             (0, 0)])
def test_a_bad_port_range_is_a_config_error(first: int, last: int) -> None:
    with pytest.raises(ConfigError, match=f"gang ports {first}-{last}: need "
                                          r"1024 <= first <= last <= 65535"):
        GangPorts(first, last)


def test_default_ports_are_the_site_range() -> None:
    assert (GangPorts().first, GangPorts().last) == (29400, 29999)
    assert GangPorts(1024, 65535).last == 65535


# -- the gang's ranks ----------------------------------------------------------------------
def test_of_places_every_rank_of_the_layout_as_its_own_node_level_job() -> None:
    gang = _gang()
    n0, n1 = _train()
    assert gang.slots == (RankSlot(0, 0, n0, JobRef("j", 1000)),
                          RankSlot(1, 1, n0, JobRef("j.r1", 1000)),
                          RankSlot(2, 0, n1, JobRef("j.r2", 1000)),
                          RankSlot(3, 1, n1, JobRef("j.r3", 1000)))
    assert gang.size == 4 and gang.lead.job == JOB
    assert [s.rank for s in gang.others] == [1, 2, 3]
    assert gang.nodes() == (n0, n1)
    assert (gang.world, gang.port, gang.formations) == (None, None, 0)


def test_of_maps_layout_nodes_to_the_members_training_nodes_in_order() -> None:
    gang = _gang(train_nodes=(1, 0))
    n0, n1 = _train()
    assert [(s.rank, s.local_rank, s.node.name, s.job.job_id) for s in gang.slots] == [
        (0, 0, "h800-1", "j"), (1, 1, "h800-1", "j.r1"),
        (2, 0, "h800-0", "j.r2"), (3, 1, "h800-0", "j.r3")]
    assert gang.nodes() == (n1, n0)   # rank 0's node first


def test_not_whole_is_rank_zero_alone_on_the_first_training_node() -> None:
    gang = _gang(whole=False)
    assert gang.slots == (RankSlot(0, 0, _train()[0], JOB),)
    assert gang.size == 1 and gang.others == () and gang.nodes() == (_train()[0],)
    assert _gang(whole=False, train_nodes=(1, 0)).lead.node.name == "h800-1"


def test_of_without_a_layout_is_one_rank() -> None:
    gang = Gang.of(MemberSpec("j", train_nodes=(1,)), JOB, _train())
    assert [(s.rank, s.local_rank, s.node.name, s.job) for s in gang.slots] == [
        (0, 0, "h800-1", JOB)]


# -- a phase on every rank -----------------------------------------------------------------
def test_activate_starts_every_rank_in_one_world() -> None:
    gang, link = _gang(), FakeLink()
    gang.activate(link, PORTS, (), FN, ARGS, CODE, Phase.TRAIN)
    port = PORTS.pick("j", 0, ())
    world = f"tcp://10.0.0.1:{port}"
    assert (gang.world, gang.port, gang.formations) == (world, port, 1)
    calls = link.of(Op.ACTIVATE)
    assert [(c[0], c[1], c[3]["job"]) for c in calls] == [
        ("call", "h800-0", "j"), ("call", "h800-0", "j.r1"),
        ("call", "h800-1", "j.r2"), ("call", "h800-1", "j.r3")]
    assert len(link.calls) == 4
    for rank, call in enumerate(calls):
        assert {k: v for k, v in call[3].items() if k != "args"} == {
            "job": "j" if rank == 0 else f"j.r{rank}", "phase": "train", "entry": FN,
            "workdir": "/jobs/j", "tenant": "j"}   # one device tenant: the member
        got = _ranked(call)
        assert (got.rank, got.local_rank, got.world_size, got.init_method, got.job_id,
                got.gpus) == (rank, rank % 2, 4, world, "j", 2)   # 2 ranks on each node
        assert (got.entry_point, got.seed, got.options) == ("builtin:grpo-toy", 7, {"lr": 0.1})


def test_activate_meets_on_the_loopback_when_rank_zeros_node_has_no_address() -> None:
    gang, link = _gang(address=None), FakeLink()
    gang.activate(link, PORTS, (), FN, ARGS, {}, Phase.TRAIN)
    port = PORTS.pick("j", 0, ())
    assert gang.world == f"tcp://127.0.0.1:{port}"
    assert {_ranked(c).init_method for c in link.of(Op.ACTIVATE)} == {gang.world}


def test_activate_skips_ports_taken_on_the_node() -> None:
    taken = PORTS.pick("j", 0, ())
    gang = _gang()
    gang.activate(FakeLink(), PORTS, [taken], FN, ARGS, {}, Phase.TRAIN)
    assert gang.port == 30000 + (taken - 30000 + 1) % 10


def test_a_second_activate_keeps_the_live_world() -> None:
    gang, link = _gang(), FakeLink()
    gang.activate(link, PORTS, (), FN, ARGS, {}, Phase.TRAIN)
    world, port = gang.world, gang.port
    assert port is not None
    gang.activate(link, PORTS, [port], FN, ARGS, {}, Phase.TRAIN)   # its own port: taken
    assert (gang.world, gang.port, gang.formations) == (world, port, 1)
    calls = link.of(Op.ACTIVATE)
    assert len(calls) == 8
    assert [_ranked(c).init_method for c in calls] == [world] * 8
    assert [_ranked(c).rank for c in calls[4:]] == [0, 1, 2, 3]


def test_a_failed_activate_stops_the_gang_and_raises() -> None:
    gang, link = _gang(), FakeLink(fail_at=3, error=NodeGone("h800-1 is gone"))
    with pytest.raises(NodeGone, match="h800-1 is gone"):
        gang.activate(link, PORTS, (), FN, ARGS, {}, Phase.TRAIN)
    assert [c[3]["job"] for c in link.of(Op.ACTIVATE)] == ["j", "j.r1", "j.r2"]
    drops = link.of(Op.DROP)
    assert drops == [("best_effort", "h800-0", Op.DROP, {"job": "j", "keep_checkpoints": True}),
                     ("best_effort", "h800-0", Op.DROP,
                      {"job": "j.r1", "keep_checkpoints": True}),
                     ("best_effort", "h800-1", Op.DROP,
                      {"job": "j.r2", "keep_checkpoints": True}),
                     ("best_effort", "h800-1", Op.DROP,
                      {"job": "j.r3", "keep_checkpoints": True})]
    assert link.calls[-4:] == drops          # stopped after the failure, nothing more
    assert (gang.world, gang.port, gang.formations) == (None, None, 1)

    again = FakeLink()
    gang.activate(again, PORTS, (), FN, ARGS, {}, Phase.TRAIN)   # a new world, formed again
    port = PORTS.pick("j", 1, ())
    assert (gang.world, gang.port, gang.formations) == (f"tcp://10.0.0.1:{port}", port, 2)
    assert port != PORTS.pick("j", 0, ())
    assert {_ranked(c).init_method for c in again.of(Op.ACTIVATE)} == {gang.world}


def test_a_single_rank_activates_with_its_own_arguments_and_no_world() -> None:
    gang, link = _gang(whole=False), FakeLink()
    gang.activate(link, PORTS, (), FN, ARGS, CODE, Phase.ROLLOUT)
    assert (gang.world, gang.port, gang.formations) == (None, None, 0)
    [call] = link.calls
    assert (call[1], call[2], call[3]["job"], call[3]["phase"]) == (
        "h800-0", Op.ACTIVATE, "j", "rollout")
    assert call[3]["args"] == [dataclasses.replace(ARGS, gpus=1).encode()]
    got = _ranked(call)
    assert (got.rank, got.world_size, got.init_method, got.job_id) == (0, 1, None, None)


def test_a_single_rank_that_fails_to_activate_is_not_stopped() -> None:
    gang, link = _gang(whole=False), FakeLink(fail_at=1)
    with pytest.raises(WeaveError, match="activate refused"):
        gang.activate(link, PORTS, (), FN, ARGS, {}, Phase.TRAIN)
    assert [c[2] for c in link.calls] == [Op.ACTIVATE]


def test_stop_drops_every_rank_of_a_gang_but_a_gang_of_one_does_nothing() -> None:
    one, link = _gang(whole=False), FakeLink()
    one.stop(link)
    assert link.calls == []
    gang = _gang()
    gang.activate(FakeLink(), PORTS, (), FN, ARGS, {}, Phase.TRAIN)
    assert (gang.port, gang.formations) == (PORTS.pick("j", 0, ()), 1)
    gang.stop(link)
    assert link.calls == [
        ("best_effort", n, Op.DROP, {"job": j, "keep_checkpoints": True})
        for n, j in (("h800-0", "j"), ("h800-0", "j.r1"), ("h800-1", "j.r2"),
                     ("h800-1", "j.r3"))]
    assert (gang.world, gang.port) == (None, None)


# -- every rank's phase --------------------------------------------------------------------
def _worker(state: str, rc: int | None = None, **more: Any) -> dict[str, Any]:
    return {"state": state, "returncode": rc, **more}


JOBS = ("j", "j.r1", "j.r2", "j.r3")


def test_all_ranks_exited_is_exited_with_rank_zeros_worker() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {
        j: _worker("exited", 0, pid=i) for i, j in enumerate(JOBS)}
    link = FakeLink(phases=phases)
    state, worker, fault = read_phase(link, _gang().slots, Phase.TRAIN)
    assert (state, worker, fault) == (WorkerState.EXITED, _worker("exited", 0, pid=0), None)
    assert [(c[1], c[2], c[3]) for c in link.calls] == [
        ("h800-0", Op.PHASE, {"job": "j"}), ("h800-0", Op.PHASE, {"job": "j.r1"}),
        ("h800-1", Op.PHASE, {"job": "j.r2"}), ("h800-1", Op.PHASE, {"job": "j.r3"})]


def test_any_rank_running_is_running() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {
        j: _worker("exited", 0) for j in JOBS}
    phases["j.r2"] = _worker("running")
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert (state, worker, fault) == (WorkerState.RUNNING, _worker("exited", 0), None)


def test_a_killed_rank_is_preferred_over_another_ranks_failed_phase() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("running") for j in JOBS}
    phases["j.r1"] = _worker("failed", 1, error="RuntimeError: NCCL communicator aborted")
    phases["j.r3"] = _worker("killed", -9)
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert state is WorkerState.KILLED and worker == _worker("killed", -9)
    assert fault == Fault(FaultKind.WORKER_KILLED, "h800-1", Phase.TRAIN, -9)


def test_a_killed_rank_is_preferred_over_a_rank_that_exited_with_a_code() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("running") for j in JOBS}
    phases["j.r1"] = _worker("failed", 1)           # no error text: WORKER_EXITED
    phases["j.r3"] = _worker("killed", -9)
    _, _, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert fault == Fault(FaultKind.WORKER_KILLED, "h800-1", Phase.TRAIN, -9)


def test_a_failed_phase_alone_is_that_ranks_fault() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("exited", 0) for j in JOBS}
    phases["j.r2"] = _worker("failed", 1, error="ValueError: bad batch")
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert state is WorkerState.FAILED and worker["error"] == "ValueError: bad batch"
    assert fault == Fault(FaultKind.PHASE_FAILED, "h800-1", Phase.TRAIN, 1,
                          "ValueError: bad batch")


def test_a_rank_that_cannot_be_read_is_a_fault_naming_its_node() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("running") for j in JOBS}
    phases["j.r1"] = _worker("failed", 1, error="RuntimeError: peer lost")
    phases["j.r2"] = WeaveError("node daemon refused: budget")
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert (state, worker) == (None, {})
    assert fault == Fault(FaultKind.REQUEST_FAILED, "h800-1", Phase.TRAIN, None,
                          "node daemon refused: budget")


def test_a_rank_whose_daemon_is_gone_is_a_node_fault_of_that_node() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("exited", 0) for j in JOBS}
    phases["j.r1"] = NodeGone("connection refused")
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert (state, worker) == (None, {})
    assert fault is not None and fault.kind is FaultKind.NODE_GONE
    assert (fault.node, fault.phase, fault.evidence) == ("h800-0", Phase.TRAIN,
                                                         "connection refused")


def test_a_rank_with_no_phase_on_its_node_is_killed() -> None:
    phases: dict[str, dict[str, Any] | WeaveError] = {j: _worker("exited", 0) for j in JOBS}
    phases["j.r3"] = {}
    state, worker, fault = read_phase(FakeLink(phases=phases), _gang().slots, Phase.TRAIN)
    assert (state, worker) == (None, {})
    assert fault == Fault(FaultKind.WORKER_KILLED, "h800-1", Phase.TRAIN, evidence=(
        "the node daemon reports no such phase of rank 3 of 4 (state None)"))


def test_a_single_rank_reads_as_before() -> None:
    slots = _gang(whole=False).slots
    link = FakeLink(phases={"j": _worker("killed", -15)})
    state, worker, fault = read_phase(link, slots, Phase.ROLLOUT)
    assert state is WorkerState.KILLED and worker == _worker("killed", -15)
    assert fault == Fault(FaultKind.WORKER_KILLED, "h800-0", Phase.ROLLOUT, -15)
    link = FakeLink(phases={"j": {"state": "gone"}})
    assert read_phase(link, slots, Phase.ROLLOUT)[2] == Fault(
        FaultKind.WORKER_KILLED, "h800-0", Phase.ROLLOUT,
        evidence="the node daemon reports no such phase (state 'gone')")


# -- rollout engines -----------------------------------------------------------------------
def _rollout() -> tuple[NodeRef, NodeRef, NodeRef]:
    return tuple(NodeRef(f"h20-{i}", Pool.ROLLOUT, Path(f"/run/weave/h20-{i}.sock"),
                         f"10.0.1.{i}", 7070) for i in range(3))  # type: ignore[return-value]


def _engines() -> Gang:
    spec = MemberSpec("j", rollout_pins=(2, 0), layout=MemberLayout(
        TrainLayout((1,)), RolloutLayout(1, (2, 1))))
    return Gang.engines_of(spec, JOB, _rollout())


def test_engines_sit_on_their_pins_as_their_own_node_level_jobs() -> None:
    engines = _engines()
    assert not engines.collective
    assert [(s.rank, s.local_rank, s.node.name, s.job) for s in engines.slots] == [
        (0, 0, "h20-2", JobRef("j", 1000)), (1, 1, "h20-2", JobRef("j.e1", 1000)),
        (2, 0, "h20-0", JobRef("j.e2", 1000))]
    assert [n.name for n in engines.nodes()] == ["h20-2", "h20-0"]


def test_engines_activate_with_their_place_but_form_no_world() -> None:
    engines, link = _engines(), FakeLink()
    engines.activate(link, PORTS, (), "weave_slurm.hosted.phases:rollout", ARGS, {},
                     Phase.ROLLOUT)
    got = [(c[1], c[3]["job"], _ranked(c)) for c in link.of(Op.ACTIVATE)]
    assert [(n, j, a.rank, a.local_rank, a.world_size, a.init_method, a.job_id, a.gpus)
            for n, j, a in got] == [("h20-2", "j", 0, 0, 3, None, "j", 2),
                                    ("h20-2", "j.e1", 1, 1, 3, None, "j", 2),
                                    ("h20-0", "j.e2", 2, 0, 3, None, "j", 1)]
    assert (engines.world, engines.port, engines.formations) == (None, None, 0)
    engines.stop(link)      # engines hold no world: nothing to drop
    assert link.of(Op.DROP) == []


def test_a_member_without_a_layout_is_one_rank_and_one_engine_on_many_nodes() -> None:
    """Pins on two rollout nodes and two training nodes without a layout: one engine
    (on whichever pin is free) and one rank, not one per node."""
    spec = MemberSpec("j", rollout_pins=(0, 1), train_nodes=(0, 1))
    assert Gang.of(spec, JOB, _train()).size == 1
    assert Gang.engines_of(spec, JOB, _rollout()).size == 1


def test_weight_senders_are_each_other_nodes_first_rank() -> None:
    gang = _gang()
    assert [(n.name, j.job_id) for n, j in gang.weight_senders()] == [("h800-1", "j.r2")]
    assert _gang(train_nodes=(0, 1), whole=False).weight_senders() == ()
    one_node = Gang.of(MemberSpec("j", train_nodes=(0,), layout=MemberLayout(
        TrainLayout((2,)), RolloutLayout(1, (1,)))), JOB, _train())
    assert one_node.weight_senders() == ()          # one node: rank 0 sends alone
    assert _engines().weight_senders() == ()        # engines send nothing


def test_shard_sync_is_asked_only_of_a_gang_over_several_nodes() -> None:
    link = FakeLink()
    _gang().activate(link, PORTS, (), FN, ARGS, CODE, Phase.TRAIN, shard_sync=True)
    assert {_ranked(c).shard_sync for c in link.of(Op.ACTIVATE)} == {True}
    link = FakeLink()
    one_node = Gang.of(MemberSpec("j", train_nodes=(0,), layout=MemberLayout(
        TrainLayout((2,)), RolloutLayout(1, (1,)))), JOB, _train())
    one_node.activate(link, PORTS, (), FN, ARGS, CODE, Phase.TRAIN, shard_sync=True)
    assert {_ranked(c).shard_sync for c in link.of(Op.ACTIVATE)} == {False}
