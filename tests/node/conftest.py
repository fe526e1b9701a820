"""Fixtures of the node tests: a private store root in /dev/shm and a live daemon."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import processes
from tests.harness.scratch import shm_dir


@pytest.fixture
def shm_root() -> Iterator[Path]:
    """``/dev/shm/weave-test-XXXX/weave``; the parent is traversable by other uids."""
    with shm_dir("weave-test-") as parent:
        yield parent / "weave"


@pytest.fixture
def ckpt_root(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


@pytest.fixture
def run_as() -> Callable[[int, Callable[[], str]], str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to setuid")
    return processes.run_as


def _serve(shm_root: Path, ckpt_root: Path, resident: bool) -> Iterator[object]:
    from weave_slurm.node.daemon import NodeConfig, NodeDaemon

    daemon = NodeDaemon(NodeConfig(host_mem_gib=16 / 1024, root=shm_root,
                                   checkpoint_root=ckpt_root, stop_timeout_s=5.0,
                                   checkpoint_interval_s=0, resident_workers=resident))
    daemon.start()
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield daemon
    finally:
        daemon.shutdown()
        thread.join(10)


@pytest.fixture
def node(shm_root: Path, ckpt_root: Path) -> Iterator[object]:
    """A started and serving NodeDaemon with a 16 MiB budget, no resident workers."""
    yield from _serve(shm_root, ckpt_root, resident=False)


@pytest.fixture
def resident_node(shm_root: Path, ckpt_root: Path) -> Iterator[object]:
    """The same with its zygote and resident workers (the zygote imports torch: ~2 s)."""
    yield from _serve(shm_root, ckpt_root, resident=True)
