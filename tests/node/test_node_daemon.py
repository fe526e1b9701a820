"""The node daemon over its real Unix socket: ownership, budget, workers, drop."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from tests.harness.waits import wait_for
from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources, StateError
from weave_slurm.node.checkpoint import CheckpointStore
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op

pytestmark = pytest.mark.torch
NOBODY = 65534

# A phase worker: attach the job's state from the environment, report, then wait.
WORKER = """
import os, sys, time
from weave_slurm.node.worker import attach_from_env
state = attach_from_env()
w = state["weights"].tensors["w"]
y = w @ w.T                                   # first useful work on the attached weights
with open(sys.argv[1], "w") as f:
    f.write(f"{os.environ['WEAVE_PHASE']} {float(w.sum())} {tuple(y.shape)}")
time.sleep(600)
"""


def _written(path: Path, timeout_s: float = 60.0) -> str:
    """The text of ``path`` once it is there and not empty."""
    return wait_for(lambda: path.read_text() if path.exists() else "", timeout_s,
                    f"text in {path}")


def _client(node: NodeDaemon) -> NodeClient:
    return NodeClient(node.config.socket)


def test_put_attach_status_over_the_socket(node: NodeDaemon) -> None:
    with _client(node) as c:
        job = c.register("j1")
        w = torch.randn(32, 16)
        c.put_state(job, "weights", {"w": w}, version=5, extra={"loader_pos": 9})
        got = c.attach(job)["weights"]
        assert torch.equal(got.tensors["w"], w) and got.index.extra == {"loader_pos": 9}
        status = c.call(Op.STATUS)
    assert status["memory"]["used_bytes"] == 4096
    assert status["memory"]["free_bytes"] == 16 * 2**20 - 4096
    assert status["jobs"][0]["segments"]["weights"]["version"] == 5


def test_status_says_the_allocation_and_the_gpus_its_step_got(node: NodeDaemon) -> None:
    """What the workers it starts inherit: a GPU share's devices only (as Slurm named
    them to the daemon's step); outside Slurm none."""
    with _client(node) as c, mock.patch.dict(os.environ):
        for key in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "WEAVE_NODE_GPUS"):
            os.environ.pop(key, None)
        outside = c.call(Op.STATUS)
        os.environ.update({"SLURM_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "4,5,6,7"})
        status = c.call(Op.STATUS)
    assert (outside["allocation"], outside["gpus"]) == (None, [])
    assert (status["allocation"], status["gpus"]) == ("77", ["4", "5", "6", "7"])


def test_state_beyond_the_budget_is_refused_with_a_clear_error(node: NodeDaemon) -> None:
    with _client(node) as c:
        job = c.register("j1")
        c.put_state(job, "weights", {"w": torch.zeros(3 * 2**20 // 4 * 4)}, version=1)  # 12 MiB
        with pytest.raises(InsufficientResources, match=r"j1/optim needs 0\.008 GiB .* free"):
            c.put_state(job, "optim", {"m": torch.zeros(2**21)}, version=1)  # 8 MiB
        with pytest.raises(InfeasibleRequest, match="more than this node's whole"):
            c.put_state(job, "huge", {"m": torch.zeros(2**23)}, version=1)  # 32 MiB
        assert not node.store.seg_path(job, "optim").exists()
        assert c.call(Op.STATUS)["memory"]["per_job_bytes"] == {"j1": 12 * 2**20}


def test_another_uid_cannot_touch_the_job(
        node: NodeDaemon, run_as: Callable[[int, Callable[[], str]], str]) -> None:
    with _client(node) as c:
        job = c.register("j1")
        c.put_state(job, "weights", {"w": torch.ones(4)}, version=1)

    def intrude() -> str:
        with NodeClient(node.config.socket) as other:
            outcomes = []
            for op, args in ((Op.ATTACH_INFO, {}), (Op.DROP, {}),
                             (Op.ACTIVATE, {"phase": "train", "argv": ["/bin/true"]}),
                             (Op.ADOPT, {"from_root": "/tmp"})):
                try:
                    other.call(op, job="j1", **args)
                    outcomes.append(f"{op.value}:allowed")
                except StateError as exc:
                    outcomes.append(f"{op.value}:{exc}")
            status = other.call(Op.STATUS)
            return "\n".join([*outcomes, f"status-jobs:{len(status['jobs'])}",
                              f"status-bytes:{status['memory']['per_job_bytes']}"])

    lines = run_as(NOBODY, intrude).splitlines()
    assert len(lines) == 6, lines
    for line in lines[:3]:
        assert "uid 65534 may not touch job 'j1'" in line, line
    assert lines[3] == "adopt:adopt: only root (weaved) may move checkpoints between nodes"
    assert lines[4:] == ["status-jobs:0", "status-bytes:{}"]
    assert node.store.attach_state(job, "weights").index.version == 1


def test_worker_kill_9_leaves_state_intact(node: NodeDaemon, tmp_path: Path) -> None:
    script, ready = tmp_path / "worker.py", tmp_path / "ready"
    script.write_text(WORKER)
    w = torch.randn(64, 64)
    with _client(node) as c:
        job = c.register("j1")
        c.put_state(job, "weights", {"w": w}, version=3)
        reply = c.call(Op.ACTIVATE, job="j1", phase="train",
                       argv=[sys.executable, str(script), str(ready)],
                       env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert reply["state"] == "running" and reply["env"]["WEAVE_PHASE"] == "train"
        phase, total, shape = _written(ready).split(" ", 2)
        assert (phase, float(total), shape) == ("train", float(w.sum()), "(64, 64)")
        with pytest.raises(StateError, match="already runs phase 'train'"):
            c.call(Op.ACTIVATE, job="j1", phase="rollout", argv=["/bin/true"])
        os.kill(reply["pid"], signal.SIGKILL)
        worker = wait_for(lambda: c.call(Op.PHASE, job="j1")["worker"], 30, "the phase to end",
                          until=lambda worker: worker["state"] != "running")
        assert worker["state"] == "killed" and worker["returncode"] == -signal.SIGKILL
        got = c.attach(job)["weights"]
        assert got.index.version == 3 and got.index.complete
        assert torch.equal(got.tensors["w"], w)
        # the next phase starts fine on the same state
        again = c.call(Op.ACTIVATE, job="j1", phase="rollout", argv=["/bin/true"])
        assert again["phase"] == "rollout"


def test_drop_removes_everything_of_the_job(node: NodeDaemon) -> None:
    with _client(node) as c:
        job = c.register("j1")
        other = c.register("j2")
        c.put_state(job, "weights", {"w": torch.ones(1024)}, version=1)
        c.put_state(other, "weights", {"w": torch.ones(1024)}, version=1)
        ckpt: dict[str, Any] = c.call(Op.CHECKPOINT, job="j1")
        assert Path(ckpt["path"]).is_dir()
        c.call(Op.ACTIVATE, job="j1", phase="rollout", argv=["/bin/sleep", "600"])
        assert c.call(Op.DROP, job="j1")["dropped"]
        assert not node.store.job_dir(job).exists()
        assert not node.ckpt.job_dir(job).exists()
        assert not Path(ckpt["path"]).exists()
        status = c.call(Op.STATUS)
        assert [j["job"] for j in status["jobs"]] == ["j2"]
        assert status["memory"]["per_job_bytes"] == {"j2": 4096}
        with pytest.raises(StateError, match="not registered"):
            c.call(Op.ATTACH_INFO, job="j1")
        assert "j1" not in (node.config.root / "registry.json").read_text()


def test_checkpoint_and_restore_through_the_daemon(node: NodeDaemon) -> None:
    with _client(node) as c:
        job = c.register("j1")
        w = torch.randn(128)
        c.put_state(job, "weights", {"w": w}, version=2)
        c.call(Op.CHECKPOINT, job="j1")
        node.store.delete_job(job)
        reply = c.call(Op.RESTORE, job="j1", drop_cache=True)
        assert reply["versions"] == {"weights": 2}
        assert torch.equal(c.attach(job)["weights"].tensors["w"], w)


def test_adopt_moves_a_lost_nodes_checkpoint_in(node: NodeDaemon, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("adopt is root's (weaved's) op")
    lost = CheckpointStore(tmp_path / "lost-node")
    job = JobRef("j1", 0)
    w = torch.randn(32)
    with _client(node) as c:
        c.register("j1")
        c.put_state(job, "weights", {"w": w}, version=5)
        lost.save(node.store, job)          # as if written by the lost node's daemon
        c.call(Op.DROP, job="j1")
        c.register("j1")
        with pytest.raises(ConfigError, match="from_root must be an absolute path"):
            c.call(Op.ADOPT, job="j1", from_root="lost-node")
        reply = c.call(Op.ADOPT, job="j1", from_root=str(lost.root))
        assert reply["versions"] == {"weights": 5}
        c.call(Op.RESTORE, job="j1")
        assert torch.equal(c.attach(job)["weights"].tensors["w"], w)
    assert not lost.job_dir(job).exists()


def test_oversized_request_gets_one_reason_then_the_connection_closes(node: NodeDaemon) -> None:
    """The reason reaches the client (no broken pipe) and the daemon does not spin."""
    import json
    import socket

    from weave_slurm.node.protocol import MAX_LINE_BYTES

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(node.config.socket))
        s.sendall(b"x" * (MAX_LINE_BYTES + 300 * 1024) + b"\n")
        stream = s.makefile("rb")
        assert json.loads(stream.readline())["error"] == "LineTooLong"
        assert stream.readline() == b""  # closed after the one reply
    with _client(node) as c:  # and it still serves others
        assert "memory" in c.call(Op.STATUS)


def test_a_bug_in_a_handler_is_an_internal_error_and_the_connection_goes_on(
        node: NodeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller gets the bug in words, not a dropped connection (which it would take
    for the daemon gone), and its next request is served."""
    def broken(uid: int, request: Any) -> dict[str, Any]:
        raise KeyError("worker")

    monkeypatch.setitem(node._handlers, Op.PHASE, broken)
    with _client(node) as c:
        c.register("j1")
        with pytest.raises(StateError, match="internal error: KeyError: 'worker'"):
            c.call(Op.PHASE, job="j1")
        assert "memory" in c.call(Op.STATUS)


def test_callers_arriving_together_at_a_busy_daemon_wait_their_turn(
        node: NodeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the daemon's accept loop is held up, 32 callers connect at once (the ranks
    of a member, weaved's probes): each is queued and served, none refused at connect
    (socketserver's backlog of 5 failed the seventh with EAGAIN: 'daemon gone')."""
    import threading

    held, release = threading.Event(), threading.Event()
    server = node._server
    assert server is not None

    def slow_accept(request: Any, address: Any) -> bool:
        held.set()
        release.wait(30)
        return True

    monkeypatch.setattr(server, "verify_request", slow_accept)
    first = NodeClient(node.config.socket, timeout_s=30)   # accepted, then the loop waits
    assert held.wait(10)
    callers = [NodeClient(node.config.socket, timeout_s=30) for _ in range(32)]
    monkeypatch.undo()
    release.set()
    try:
        for c in [first, *callers]:
            assert "memory" in c.call(Op.STATUS)
    finally:
        for c in [first, *callers]:
            c.close()
