"""Failure isolation and clean departure, on real node daemons (LocalBackend)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.helpers import assert_same_as_solo, members
from weave_slurm.node.client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import MemberState, NodeRef
from weave_slurm.runtime.runner import GroupRunner, Member

pytestmark = pytest.mark.torch


def _worker_pid(node: NodeRef, job_id: str) -> int | None:
    with NodeClient(node.socket_path) as client:
        status = client.call(Op.STATUS)
    for job in status["jobs"]:
        if job["job"] == job_id and job.get("resident"):
            pid = job["resident"].get("pid")
            return int(pid) if pid else None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_killed_worker_is_readmitted_and_others_unaffected(local_fleet: object) -> None:
    specs = members(3, 3, "k")
    ex = GroupRunner(local_fleet.layout, specs)  # type: ignore[attr-defined]
    killed: list[int] = []

    def kill_mid_train(member: Member, why: str) -> None:
        if member.spec.job_id == "k1" and member.state is MemberState.TRAIN \
                and member.version == 2 and not killed and member.running is not None:
            pid = _worker_pid(member.running.node, "k1")
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    ex.listeners.append(kill_mid_train)
    try:
        ex.run(timeout_s=300)
        assert killed, "the test never killed a worker"
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3
        assert ex.members["k1"].recoveries == 1
        assert ex.members["k0"].recoveries == ex.members["k2"].recoveries == 0
        assert any(not s.ok and s.job_id == "k1" for s in ex.spans)
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        for spec in specs:
            if spec.job_id in ex.order:
                ex.leave(spec.job_id)
        ex.close()


def test_cancel_mid_rollout_leaves_nothing_behind(local_fleet: object) -> None:
    fleet = local_fleet
    specs = members(2, 3, "c")
    ex = GroupRunner(fleet.layout, specs)  # type: ignore[attr-defined]
    pids: list[int] = []

    def cancel_in_rollout(executor: GroupRunner) -> None:
        m = executor.members["c0"]
        if m.state is MemberState.ROLLOUT and m.version == 1 and "c0" in executor.order:
            for node in (m.train_node, *m.rollout_nodes):
                pid = _worker_pid(node, "c0")
                if pid is not None:
                    pids.append(pid)
            executor.leave("c0")

    try:
        ex.run(timeout_s=240, on_tick=cancel_in_rollout)
        assert ex.members["c0"].state is MemberState.CANCELLED
        assert ex.members["c1"].state is MemberState.DONE
        assert len(pids) == 2
        assert [p for p in pids if _alive(p)] == []
        uid = str(os.getuid())
        for node in (*fleet.layout.rollout, *fleet.layout.train):  # type: ignore[attr-defined]
            assert not (fleet.root(node.name) / uid / "c0").exists()  # type: ignore[attr-defined]
            with NodeClient(node.socket_path) as client:
                jobs = {j["job"] for j in client.call(Op.STATUS)["jobs"]}
            assert "c0" not in jobs
        ckpt = fleet.config.state_dir / "ckpt"  # type: ignore[attr-defined]
        assert list(ckpt.glob(f"*/{uid}/c0/*")) == []
        assert_same_as_solo(ex, specs[1])
    finally:
        for spec in specs:
            if spec.job_id in ex.order:
                ex.leave(spec.job_id)
        ex.close()
