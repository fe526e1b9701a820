"""Weights train -> rollout through the two-tier sync agents, in a running group.

One training and two rollout node daemons (LocalBackend, real processes, real
/dev/shm); the executor's weight transfer is ``twotier``: one sync agent per node
(gloo over loopback TCP), stage 1 to the owner of each shard, stage 2 relayed inside
the rollout pool. Members end bit-identical to their solo runs; a duplicate version is
refused and fails only its member; a sync agent killed mid-transfer fails its member
within the timeout, the agents are started afresh, and nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.processes import pid_alive
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, each_change, group_weights, leave_all
from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.runtime.group import MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig, RunningMember
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer

pytestmark = pytest.mark.torch

STEPS = 3
TWOTIER = WeightTransferKind.TWOTIER


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """One training (h800) and two rollout (h20) node daemons as local processes."""
    with running_fleet(tmp_path_factory.mktemp("twotier"), "tt", "weave-test-tt-",
                       rollout_nodes=2) as fleet:
        yield fleet


def _executor(fleet: NodeFleet, specs: Sequence[MemberSpec], **site: Any
              ) -> tuple[GroupRunner, TwoTierTransfer]:
    """A runner of ``specs`` on ``fleet`` whose weights cross by the two-tier agents
    (``site``: its ``[runtime]`` keys)."""
    assert fleet.layout is not None
    ex = GroupRunner(fleet.layout, specs, config=RunnerConfig(weight_transfer=TWOTIER, **site))
    assert isinstance(ex.transfer, TwoTierTransfer)
    return ex, ex.transfer


def _finish(ex: GroupRunner, specs: Sequence[MemberSpec]) -> list[int]:
    """Leave, close; returns the pids of the agents that were running at the end."""
    agents = ex.transfer.agents if isinstance(ex.transfer, TwoTierTransfer) else None
    pids = agents.pids() if agents is not None else []
    leave_all(ex, specs)
    return pids


@dataclass
class _Watch:
    """When members failed, ``(job, time, why)``, and when each sync began to push."""

    failed_at: list[tuple[str, float, str]] = field(default_factory=list)
    sync_starts: list[float] = field(default_factory=list)
    on_tick: Callable[[GroupRunner], None] | None = None   # for ex.run: reads the changes


def _watch(ex: GroupRunner, transfer: TwoTierTransfer,
           strike: Callable[[RunningMember], None]) -> _Watch:
    """Record failures and sync starts; ``strike(member)`` runs on every member change
    (the runtime's events, read after each tick: ``watch.on_tick``)."""
    watch = _Watch()

    def on_change(member: RunningMember, change: MemberChanged) -> None:
        if change.state is MemberState.RECOVERING:   # at_s: the runner's monotonic clock
            watch.failed_at.append((member.spec.job_id, change.at_s, change.why))
        if member.state is change.state:
            strike(member)

    original = transfer._push

    def timed_push(*args: object, **kwargs: object) -> tuple[int, int]:
        watch.sync_starts.append(time.monotonic())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    transfer._push = timed_push  # type: ignore[method-assign]
    watch.on_tick = each_change(ex, on_change)
    return watch


def _rollout_weights(node: NodeRef, job_id: str) -> tuple[int, dict[str, torch.Tensor]]:
    with NodeClient(node.socket_path) as client:
        seg = client.attach(JobRef(job_id, os.getuid()))["weights"]
    return seg.index.version, {k: v.clone() for k, v in seg.tensors.items()}


def test_twotier_group_matches_solo(fleet2: NodeFleet) -> None:
    specs = [MemberSpec("tt0", seed=31, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1)),
             MemberSpec("tt1", seed=32, steps=STEPS, options=OPTIONS, rollout_pins=(1,)),
             MemberSpec("tt2", seed=33, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1),
                        staleness=1)]
    ex, transfer = _executor(fleet2, specs, sync_mode="delta", sync_timeout_s=30.0)
    pids: list[int] = []
    try:
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3
        for spec in specs:
            assert_same_as_solo(ex, spec)
        # every weight version crossed the agents: init (v0) + one per step, to every
        # pinned rollout node (k = 1: one node per sync, into its checked buffer)
        per_job = {s.job_id: [r.version for r in transfer.records if r.job_id == s.job_id]
                   for s in specs}
        assert per_job["tt0"] == per_job["tt1"] == list(range(STEPS + 1))
        assert sorted(per_job["tt2"]) == sorted(list(range(STEPS + 1)) * 2)
        assert all(r.slow_link_bytes > 0 for r in transfer.records)
        assert any(r.replies["train:" + ex.layout.train[0].name].get("delta_pieces")
                   for r in transfer.records), "delta mode never sent a delta"
        # the rollout nodes hold the trained weights, bit for bit (tt0: both nodes)
        final = group_weights(ex, "tt0")
        for node in ex.members["tt0"].rollout_nodes:
            version, got = _rollout_weights(node, "tt0")
            assert version == STEPS
            assert all(torch.equal(got[k], v) for k, v in final.items())
    finally:
        pids = _finish(ex, specs)
    assert len(pids) == 3
    assert not [p for p in pids if pid_alive(p)], "sync agents outlived the group"


class _Duplicating(TwoTierTransfer):
    """Delivers ``job``'s version ``at`` twice (as a retried request would)."""

    def __init__(self, base: TwoTierTransfer, job: str, at: int) -> None:
        super().__init__(base.layout, base.clients, base.config)
        self.job, self.at, self.sent = job, at, False

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]:
        version, moved = super().copy(src, dsts, job, name, as_name)
        if job.job_id == self.job and version == self.at and not self.sent:
            self.sent = True
            super().copy(src, dsts, job, name, as_name)
        return version, moved


def test_duplicate_version_is_refused_and_fails_only_its_member(fleet2: NodeFleet) -> None:
    specs = [MemberSpec("dv0", seed=41, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1)),
             MemberSpec("dv1", seed=42, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1))]
    ex, transfer = _executor(fleet2, specs, sync_timeout_s=30.0)
    dup = _Duplicating(transfer, "dv1", at=2)
    ex.transfer = dup
    try:
        ex.run(timeout_s=300)
        assert dup.sent, "the duplicate was never sent"
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        assert ex.members["dv1"].recoveries == 1
        assert ex.members["dv0"].recoveries == 0
        reasons = [why for _, state, why in ex.members["dv1"].history
                   if state is MemberState.RECOVERING]
        assert len(reasons) == 1 and "VersionMismatch" in reasons[0] \
            and "refused" in reasons[0], reasons
        # restored from its checkpoint (versions start over on the agents) and the
        # replayed steps reach the solo weights
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        _finish(ex, specs)


def test_killed_agent_fails_its_member_within_the_timeout(fleet2: NodeFleet) -> None:
    timeout_s = 5.0
    specs = [MemberSpec("ka0", seed=51, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1)),
             MemberSpec("ka1", seed=52, steps=STEPS, options=OPTIONS, rollout_pins=(1,))]
    ex, transfer = _executor(fleet2, specs, sync_timeout_s=timeout_s)
    armed: list[tuple[int, list[int]]] = []

    def arm(member: RunningMember) -> None:
        if not armed and member.spec.job_id == "ka0" and member.state is MemberState.TRAIN \
                and member.version == 1 and transfer.agents is not None:
            pids = transfer.agents.pids()
            armed.append((transfer.arm_die(ex.layout.rollout[1]), pids))

    watch = _watch(ex, transfer, arm)
    try:
        ex.run(timeout_s=300, on_tick=watch.on_tick)
        assert armed, "the test never armed an agent"
        dead_pid, first_pids = armed[0]
        assert not pid_alive(dead_pid)
        assert len(watch.failed_at) == 1, watch.failed_at
        job, when, why = watch.failed_at[0]
        assert "sync agent" in why, why
        started = max(t for t in watch.sync_starts if t <= when)
        assert when - started < 3 * timeout_s, f"failure took {when - started:.1f} s"
        others = [s.job_id for s in specs if s.job_id != job]
        assert ex.members[job].recoveries == 1
        assert all(ex.members[o].recoveries == 0 for o in others)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        # the old agents are gone, new ones carried the rest
        assert not [p for p in first_pids if pid_alive(p)]
        assert transfer.agents is not None and set(transfer.agents.pids()).isdisjoint(
            first_pids)
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        pids = _finish(ex, specs)
    assert not [p for p in pids if pid_alive(p)]


def test_hung_agent_fails_its_member_after_the_transport_timeout(fleet2: NodeFleet) -> None:
    """An agent that stops answering (SIGSTOP: alive, socket open) is not waited for
    forever: its peers' transport waits time out, the executor gives up on it at once."""
    timeout_s = 5.0
    specs = [MemberSpec("hs0", seed=61, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1)),
             MemberSpec("hs1", seed=62, steps=STEPS, options=OPTIONS, rollout_pins=(1,))]
    ex, transfer = _executor(fleet2, specs, sync_timeout_s=timeout_s)
    stopped: list[int] = []

    def stop_agent(member: RunningMember) -> None:
        if not stopped and member.spec.job_id == "hs0" and member.state is MemberState.TRAIN \
                and member.version == 1 and transfer.agents is not None:
            node = ex.layout.rollout[1]
            pid = transfer.agents.pid((node.pool, node.name))
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    watch = _watch(ex, transfer, stop_agent)
    try:
        ex.run(timeout_s=300, on_tick=watch.on_tick)
        assert stopped, "the test never stopped an agent"
        assert len(watch.failed_at) == 1, watch.failed_at
        job, when, why = watch.failed_at[0]
        assert "SyncError" in why or "sync agent" in why, why
        started = max(t for t in watch.sync_starts if t <= when)
        # the transport's timeout, not the executor's last-resort 3 x timeout + 10 s
        assert when - started < 3 * timeout_s, f"failure took {when - started:.1f} s"
        assert ex.members[job].recoveries == 1
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        assert not pid_alive(stopped[0]), "the hung agent was not killed"
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        if stopped and pid_alive(stopped[0]):
            os.kill(stopped[0], signal.SIGKILL)
        pids = _finish(ex, specs)
    assert not [p for p in pids if pid_alive(p)]
