"""A running group's rollout nodes change: a node added (rollout scaling), a member
re-pinned to another node, a node retired (the group shrank), on real node daemons
(LocalBackend, real processes, real /dev/shm) with the two-tier weight transfer, whose
sync agents form one world per layout. Members already running never stop (no
recovery), a member that joins on the added node and one that moves both end with their
solo weights, bit for bit, and a node left behind holds nothing of them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.processes import node_status
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, leave_all
from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.errors import ConfigError, StateError
from weave_slurm.runtime.group import GroupLayout, MemberSpec, MemberState
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Join, Repin
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch

TWOTIER = RunnerConfig(weight_transfer=WeightTransferKind.TWOTIER, sync_timeout_s=30.0)


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """One training (h800) and two rollout (h20) node daemons as local processes."""
    with running_fleet(tmp_path_factory.mktemp("relayout"), "rl", "weave-test-rl-",
                       rollout_nodes=2) as fleet:
        yield fleet


def _until(ex: GroupRunner, done: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"not {what} within {timeout_s} s: {ex.status()}")
        if not ex.tick():
            time.sleep(0.005)


def _rollout_nodes(ex: GroupRunner, job_id: str) -> list[str]:
    """The nodes ``job_id``'s rollouts ran on, in order."""
    return [s.node for s in sorted(ex.spans, key=lambda s: s.start_s)
            if s.job_id == job_id and s.kind is Phase.ROLLOUT and s.ok]


def _agents_world(ex: GroupRunner) -> list[str]:
    assert isinstance(ex.transfer, TwoTierTransfer)
    agents = ex.transfer.agents
    return [] if agents is None else [node.name for _, node in agents.world]


def _never_recovered(ex: GroupRunner, job_id: str) -> None:
    member = ex.members[job_id]
    assert member.recoveries == 0 and member.fault is None, member.event()
    assert MemberState.RECOVERING not in [state for _, state, _ in member.history]


def test_extend_adds_a_node_and_a_member_joins_there_while_the_others_run(
        fleet2: NodeFleet) -> None:
    assert fleet2.layout is not None
    r0, r1 = fleet2.layout.rollout
    t0 = fleet2.layout.train[0]
    a = MemberSpec("xa", seed=41, steps=4, options=OPTIONS)
    b = MemberSpec("xb", seed=42, steps=3, options=OPTIONS, rollout_pins=(1,))
    ex = GroupRunner(GroupLayout((r0,), (t0,)), [a], config=TWOTIER)
    try:
        _until(ex, lambda: ex.members["xa"].version >= 1, "xa at v1")
        assert _agents_world(ex) == ["h800-0", "h20-0"]
        with pytest.raises(ConfigError, match="h20-0: add rollout nodes"):
            ex.extend([r0])
        ex.extend([r1])
        assert [n.name for n in ex.layout.rollout] == ["h20-0", "h20-1"]
        assert _agents_world(ex) == []          # stopped: the next sync starts them anew
        GroupPort(ex).apply(Join(b))
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in (a, b)] == [MemberState.DONE] * 2
        assert _agents_world(ex) == ["h800-0", "h20-0", "h20-1"]
        for spec in (a, b):
            assert_same_as_solo(ex, spec)
        _never_recovered(ex, "xa")
        assert set(_rollout_nodes(ex, "xa")) == {"h20-0"}
        assert set(_rollout_nodes(ex, "xb")) == {"h20-1"}
        transfer = ex.transfer
        assert isinstance(transfer, TwoTierTransfer)
        synced = {(r.job_id, k) for r in transfer.records for k in r.replies}
        assert ("xb", "rollout:h20-1") in synced and ("xb", "rollout:h20-0") not in synced
    finally:
        leave_all(ex, [a, b])


def _holds(fleet: NodeFleet, node: str, job_id: str) -> bool:
    assert fleet.layout is not None
    path = next(n.socket_path for n in (*fleet.layout.rollout, *fleet.layout.train)
                if n.name == node)
    return job_id in [j["job"] for j in node_status(path)["jobs"]]


def test_a_repinned_member_moves_between_phases_and_its_old_node_is_retired(
        fleet2: NodeFleet) -> None:
    """xd (staleness 1: its rollouts read a ring of weight versions) moves from h20-1 to
    h20-0, next to xc; h20-1 can be retired only once nobody is on it."""
    assert fleet2.layout is not None
    c = MemberSpec("xc", seed=43, steps=4, options=OPTIONS)
    d = MemberSpec("xd", seed=44, steps=4, options=OPTIONS, rollout_pins=(1,), staleness=1)
    ex = GroupRunner(fleet2.layout, [c, d], config=TWOTIER)
    try:
        _until(ex, lambda: ex.members["xd"].version >= 1, "xd at v1")
        assert _holds(fleet2, "h20-1", "xd")
        GroupPort(ex).apply(Repin("xd", (0,)))
        with pytest.raises(StateError, match="h20-1 still serve a member"):
            ex.retire(["h20-1"])
        moved = ex.members["xd"]
        _until(ex, lambda: moved.repin is None, "xd moved to h20-0")
        assert moved.rollout_nodes == (fleet2.layout.rollout[0],)
        assert moved.spec.rollout_pins == (0,)
        ex.retire(["h20-1"])
        assert [n.name for n in ex.layout.rollout] == ["h20-0"]
        assert ex.members["xd"].spec.rollout_pins == (0,)
        assert not _holds(fleet2, "h20-1", "xd")   # its rollout state there was dropped
        ex.run(timeout_s=300)
        for spec in (c, d):
            assert_same_as_solo(ex, spec)
        _never_recovered(ex, "xc")
        _never_recovered(ex, "xd")
        nodes = _rollout_nodes(ex, "xd")
        assert nodes[0] == "h20-1" and nodes[-1] == "h20-0"
        assert nodes == sorted(nodes, reverse=True)   # never back on h20-1 once moved
        assert _agents_world(ex) == ["h800-0", "h20-0"]
    finally:
        leave_all(ex, [c, d])

