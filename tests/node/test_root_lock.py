"""One node daemon serves a root at a time, also while an old one stops: its lock file
goes last, while held, and a daemon starting meanwhile waits for it (node/root_lock.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from weave_slurm.errors import StateError
from weave_slurm.node.daemon import NodeConfig, NodeDaemon
from weave_slurm.node.ending import end_allocation
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op, Request
from weave_slurm.node.root_lock import RootLock


def test_a_second_holder_waits_and_takes_the_file_its_holder_made_anew(
        shm_root: Path) -> None:
    first, second = RootLock(shm_root), RootLock(shm_root)
    assert first.acquire(0)
    assert not second.acquire(0.2)
    got = threading.Event()
    waits: list[int] = []

    def take() -> None:
        if second.acquire(10, lambda: waits.append(1)):
            got.set()

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.3)
    assert not got.is_set() and waits == [1]
    first.release(remove=True)          # the holder removes its file, then lets go
    thread.join(10)
    assert got.is_set() and second.held
    # the waiter's first open was of the removed file: it holds the root's new one (a
    # third cannot take that)
    assert second.path.exists()
    assert not RootLock(shm_root).acquire(0)
    second.release()


def _register(daemon: NodeDaemon, job: str) -> None:
    daemon.handle(0, Request(Op.REGISTER, {"job": job, "resident": False}))


def _serving(daemon: NodeDaemon) -> threading.Thread:
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread


def _config(shm_root: Path, ckpt_root: Path) -> NodeConfig:
    return NodeConfig(host_mem_gib=0.01, root=shm_root, checkpoint_root=ckpt_root,
                      resident_workers=False, checkpoint_interval_s=0)


@pytest.mark.torch
def test_a_daemon_whose_allocation_ended_leaves_the_root_to_the_next_one(
        shm_root: Path, ckpt_root: Path) -> None:
    """The old daemon's allocation ended (as ``weave node serve`` does at that signal: its
    state discarded, the root given up) and a new allocation starts a daemon on the same
    root and socket before the old one has stopped: the new one starts at once, the old
    one refuses what still comes, and its stop leaves the new one's jobs, registry and
    socket alone (it removed them when both held the root: tests/reliability/test_chaos)."""
    config = _config(shm_root, ckpt_root)
    old = NodeDaemon(config)
    old.start()
    old_thread = _serving(old)
    _register(old, "a")
    end_allocation(old, "job 7 is NODE_FAIL")
    with pytest.raises(StateError, match="stopping: its allocation no longer runs"):
        _register(old, "late")
    new = NodeDaemon(NodeConfig(**{**config.__dict__, "root_wait_s": 0.0}))
    new.start()
    new_thread = _serving(new)
    try:
        _register(new, "b")
        old.shutdown()
        old_thread.join(10)
        assert new.store.job_dir(JobRef("b", 0)).is_dir()
        assert [j.job_id for j in new.registry.jobs()] == ["b"]
        assert (shm_root / "registry.json").exists() and (shm_root / ".daemon.lock").exists()
        with NodeClient(config.socket) as client:    # its socket, not removed by the old
            assert [j["job"] for j in client.call(Op.STATUS)["jobs"]] == ["b"]
    finally:
        new.shutdown()
        new_thread.join(10)
    assert new.store.job_dir(JobRef("b", 0)).is_dir()     # registered: kept warm


@pytest.mark.torch
def test_a_daemon_starting_while_the_old_one_stops_waits_for_it(
        shm_root: Path, ckpt_root: Path) -> None:
    """A stop that keeps warm state (a job registered) holds the root until it ends: the
    next daemon waits for it, then adopts the job."""
    config = _config(shm_root, ckpt_root)
    old = NodeDaemon(config)
    old.start()
    _register(old, "a")
    new = NodeDaemon(NodeConfig(**{**config.__dict__, "root_wait_s": 30.0}))
    started = threading.Event()

    def start() -> None:
        new.start()
        started.set()

    thread = threading.Thread(target=start)
    thread.start()
    try:
        assert not started.wait(0.5), "a second daemon took the root of a live one"
        old.shutdown()
        assert started.wait(10)
        assert [j.job_id for j in new.registry.jobs()] == ["a"]
    finally:
        thread.join(30)
        new.shutdown()
