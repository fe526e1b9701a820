"""A pooled member on real node daemons (LocalBackend, real processes, real /dev/shm):
its rollout spread over the group's pool as ``E`` engines, the width changed at turn
boundaries (1 engine on one node -> 2 engines on two nodes -> 4 engines on the same
two), and a killed engine recovered. Each ends bit-identical to its solo run (one
engine, one process: ``sampling = "per_prompt"`` makes the batch the same at any
width); a widening onto nodes it already holds copies nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.processes import node_status, pid_alive
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, kill_once, leave_all, worker_pids
from weave_slurm.runtime.faults import FaultKind
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Repin
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase

pytestmark = [pytest.mark.torch, pytest.mark.slow]

PER_PROMPT = {**OPTIONS, "sampling": "per_prompt"}


@pytest.fixture(scope="module")
def pool_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """One training and two rollout node daemons, local processes."""
    with running_fleet(tmp_path_factory.mktemp("pool"), "pool", "weave-test-pool-",
                       rollout_nodes=2) as fleet:
        yield fleet


class _Events(logging.Handler):
    """What the runtime did, in order: each copy (the observer's ``synced``), each
    phase that ended, and each rollout move (the relayout's log line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, Any]] = []

    def phase_ended(self, span: Span) -> None:
        self.seen.append(("phase", span.kind))

    def synced(self, span: Span, what: str, nbytes: int) -> None:
        self.seen.append(("copy", what))

    def emit(self, record: logging.LogRecord) -> None:
        if "rollout moved" in record.getMessage():
            self.seen.append(("moved", record.getMessage()))

    def copies_per_move(self) -> list[list[str]]:
        """The copies made by each move (before the member's next phase ended)."""
        out: list[list[str]] = []
        moving = False
        for kind, what in self.seen:
            if kind == "moved":
                out.append([])
                moving = True
            elif kind == "phase":
                moving = False
            elif moving:
                out[-1].append(what)
        return out


def test_a_pooled_member_widens_mid_run_and_matches_its_solo_run(
        pool_fleet: NodeFleet) -> None:
    spec = MemberSpec("pw", seed=61, steps=6, options=PER_PROMPT, rollout_pins=(0,),
                      pool=(1,))
    events = _Events()
    ex = GroupRunner(pool_fleet.layout, [spec], observer=events)  # type: ignore[arg-type]
    port = GroupPort(ex)
    relayout_log = logging.getLogger("weave_slurm.runtime.relayout")
    relayout_log.addHandler(events)
    old_level = relayout_log.level
    relayout_log.setLevel(logging.INFO)
    widths: dict[int, tuple[int, tuple[str, ...]]] = {}   # rollout step -> engines, nodes
    asked: list[int] = []

    def on_tick(runner: GroupRunner) -> None:
        m = runner.members["pw"]
        run = m.runs.get(Phase.ROLLOUT)
        if run is not None and run.step not in widths:
            engines = m.engines.slots if m.engines is not None else ()
            widths[run.step] = (max(1, len(engines)),
                                tuple(sorted({s.node.name for s in engines} or {run.node.name})))
        if m.version >= 1 and not asked:          # 2 engines, one on each node
            port.apply(Repin("pw", (0, 1), (1, 1)))
            asked.append(m.version)
        elif m.version >= 3 and len(asked) == 1 and m.repin is None:   # 4, same nodes
            port.apply(Repin("pw", (0, 1), (2, 2)))
            asked.append(m.version)

    try:
        ex.run(timeout_s=600, on_tick=on_tick)
        member = ex.members["pw"]
        assert member.state is MemberState.DONE, member.event()
        assert member.recoveries == 0 and member.fault is None
        assert_same_as_solo(ex, spec)
        got = [widths[s] for s in sorted(widths)]
        assert got[0] == (1, ("h20-0",))
        assert got[-1] == (4, ("h20-0", "h20-1"))
        assert (2, ("h20-0", "h20-1")) in got
        assert [w for w, _ in got] == sorted(w for w, _ in got)   # only ever wider
        assert member.spec.pool == (2, 2) and member.spec.rollout_pins == (0, 1)
        # onto a new node: its weights copied there once; more engines on the same two
        # nodes: nothing copied
        assert events.copies_per_move() == [["weights"], []]
        rows = {j["job"] for j in node_status(pool_fleet.layout.rollout[1].socket_path)["jobs"]}  # type: ignore[union-attr]
        assert {"pw", "pw.e2", "pw.e3"} <= rows
    finally:
        relayout_log.removeHandler(events)
        relayout_log.setLevel(old_level)
        leave_all(ex, [spec])
    assert worker_pids(pool_fleet, "pw") == {}


def test_a_killed_engine_of_a_pooled_member_is_recovered(pool_fleet: NodeFleet) -> None:
    spec = MemberSpec("pk", seed=62, steps=4, options=PER_PROMPT, rollout_pins=(0, 1),
                      pool=(1, 1))
    ex = GroupRunner(pool_fleet.layout, [spec])  # type: ignore[arg-type]
    killed: list[int] = []

    try:
        ex.run(timeout_s=600, on_tick=kill_once(
            pool_fleet, "pk", "h20-1/pk.e1",
            lambda m: Phase.ROLLOUT in m.runs and m.version >= 1, killed))
        assert killed, "engine 1 of pk was never seen rolling out"
        member = ex.members["pk"]
        assert member.state is MemberState.DONE, member.event()
        assert member.recoveries >= 1 and member.fault is not None
        assert member.fault.kind in (FaultKind.WORKER_KILLED, FaultKind.PHASE_FAILED)
        assert member.fault.node == "h20-1"
        assert_same_as_solo(ex, spec)
        assert not pid_alive(killed[0])
    finally:
        leave_all(ex, [spec])


def test_a_width_change_between_a_rollout_and_its_training_step(
        pool_fleet: NodeFleet) -> None:
    """``pb`` (2 engines) is widened to 4 while its batch of 2 slices waits for the
    training node (``side`` trains there): that step merges 2 slices, the next 4."""
    spec = MemberSpec("pb", seed=63, steps=5, options=PER_PROMPT, rollout_pins=(0, 1),
                      pool=(1, 1))
    side = MemberSpec("side", seed=64, steps=5, options=OPTIONS, rollout_pins=(1,))
    ex = GroupRunner(pool_fleet.layout, [spec, side])  # type: ignore[arg-type]
    port = GroupPort(ex)
    asked: list[tuple[int, int]] = []   # (batch waiting, its slices)

    def widen_while_it_waits(runner: GroupRunner) -> None:
        m = runner.members["pb"]
        if not asked and m.state is MemberState.READY and m.next_kind is Phase.TRAIN \
                and m.rolled >= 1:
            port.apply(Repin("pb", (0, 1), (2, 2)))
            asked.append((m.rolled - 1, m.slices_of(m.rolled - 1)))

    try:
        ex.run(timeout_s=600, on_tick=widen_while_it_waits)
        assert asked, "pb never waited for the training node with a batch"
        assert asked[0][1] == 2
        member = ex.members["pb"]
        assert member.state is MemberState.DONE, member.event()
        assert member.recoveries == 0 and member.fault is None
        assert member.engines is not None and member.engines.size == 4
        for s in (spec, side):
            assert_same_as_solo(ex, s)
    finally:
        leave_all(ex, [spec, side])
