"""Failure isolation and clean departure, on real node daemons (LocalBackend)."""

from __future__ import annotations

import os

import pytest

from tests.harness.processes import kill_worker, node_status, pid_alive, worker_pid
from tests.runtime.helpers import assert_same_as_solo, each_change, leave_all, members
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner, RunningMember

pytestmark = pytest.mark.torch


def test_killed_worker_is_readmitted_and_others_unaffected(local_fleet: object) -> None:
    specs = members(3, 3, "k")
    ex = GroupRunner(local_fleet.layout, specs)  # type: ignore[attr-defined]
    killed: list[int] = []

    def kill_mid_train(member: RunningMember, change: MemberChanged) -> None:
        if member.spec.job_id == "k1" and member.state is change.state is MemberState.TRAIN \
                and member.version == 2 and not killed and member.running is not None:
            killed.append(kill_worker(member.running.node.socket_path, "k1"))

    try:
        ex.run(timeout_s=300, on_tick=each_change(ex, kill_mid_train))
        assert killed, "the test never killed a worker"
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3
        assert ex.members["k1"].recoveries == 1
        assert ex.members["k0"].recoveries == ex.members["k2"].recoveries == 0
        assert any(not s.ok and s.job_id == "k1" for s in ex.spans)
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        leave_all(ex, specs)


def test_cancel_mid_rollout_leaves_nothing_behind(local_fleet: object) -> None:
    fleet = local_fleet
    specs = members(2, 3, "c")
    ex = GroupRunner(fleet.layout, specs)  # type: ignore[attr-defined]
    pids: list[int] = []

    def cancel_in_rollout(executor: GroupRunner) -> None:
        m = executor.members["c0"]
        port = GroupPort(executor)
        if m.state is MemberState.ROLLOUT and m.version == 1 and "c0" in port.order:
            for node in (m.train_node, *m.rollout_nodes):
                pid = worker_pid(node.socket_path, "c0")
                if pid is not None:
                    pids.append(pid)
            port.apply(Leave("c0"))

    try:
        ex.run(timeout_s=240, on_tick=cancel_in_rollout)
        assert ex.members["c0"].state is MemberState.CANCELLED
        assert ex.members["c1"].state is MemberState.DONE
        assert len(pids) == 2
        assert [p for p in pids if pid_alive(p)] == []
        uid = str(os.getuid())
        for node in (*fleet.layout.rollout, *fleet.layout.train):  # type: ignore[attr-defined]
            assert not (fleet.root(node.name) / uid / "c0").exists()  # type: ignore[attr-defined]
            jobs = {j["job"] for j in node_status(node.socket_path)["jobs"]}
            assert "c0" not in jobs
        ckpt = fleet.config.state_dir / "ckpt"  # type: ignore[attr-defined]
        assert list(ckpt.glob(f"*/{uid}/c0/*")) == []
        assert_same_as_solo(ex, specs[1])
    finally:
        leave_all(ex, specs)
