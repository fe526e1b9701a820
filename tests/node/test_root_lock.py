"""One node daemon serves a root at a time, also while an old one stops: its lock file
goes last, while held, and a daemon starting meanwhile waits for it (node/root_lock.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from weave_slurm.cli.node import _discard_state
from weave_slurm.node.daemon import NodeConfig, NodeDaemon
from weave_slurm.node.index import JobRef
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
    # the waiter's first open was of the removed file: it holds the root's new one
    assert second.path.exists() and second._is_current(second._fd)  # type: ignore[arg-type]
    assert not RootLock(shm_root).acquire(0)
    second.release()


def _register(daemon: NodeDaemon, job: str) -> None:
    daemon.handle(0, Request(Op.REGISTER, {"job": job, "resident": False}))


@pytest.mark.torch
def test_a_daemon_starting_while_the_old_one_stops_keeps_its_jobs(
        shm_root: Path, ckpt_root: Path) -> None:
    """The old daemon's allocation ended (its state discarded, as ``weave node serve``
    does at that signal) and a new allocation starts a daemon on the same root before the
    old one has stopped: the new one serves only once the old one is gone, and what it is
    then given stays (the old stop removed it when both could hold the root)."""
    config = NodeConfig(host_mem_gib=0.01, root=shm_root, checkpoint_root=ckpt_root,
                        resident_workers=False, checkpoint_interval_s=0)
    old = NodeDaemon(config)
    old.start()
    _register(old, "a")
    _discard_state(old, "job 7 is NODE_FAIL")
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
        thread.join(5)
        _register(new, "b")
        assert new.store.job_dir(JobRef("b", 0)).is_dir()
        assert [j.job_id for j in new.registry.jobs()] == ["b"]
        assert (shm_root / ".daemon.lock").exists()
    finally:
        thread.join(30)
        new.shutdown()
    assert new.store.job_dir(JobRef("b", 0)).is_dir()     # registered: kept warm
