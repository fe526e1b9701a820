"""A sync agent whose allocation has ended exits on its own (docs/reliability.md, F17).

A real agent process (``python -m weave_slurm.sync.agent``) as rank 0 of a world of two
whose other rank never comes, so it blocks in ``init_process_group`` as a rank blocked
on a lost peer does. Its ``$SLURM_JOB_ID`` is one that a stand-in ``squeue`` on its
``PATH`` reports as ended: the agent's allocation watch ends the process with status 3
and says why, though its rendezvous never completes; with the job running it stays.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weave_slurm.sync.agent import AgentSpec

pytestmark = pytest.mark.torch

_KEEP: list[socket.socket] = []


def _agent(tmp_path: Path, squeue_state: str) -> subprocess.Popen[bytes]:
    node = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # a node daemon that never
    node.bind(str(tmp_path / "node.sock"))                     # answers: the agent only
    node.listen(4)                                             # connects before it joins
    _KEEP.append(node)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\necho {squeue_state}\n")
    squeue.chmod(0o755)
    spec = AgentSpec(0, (("train", "h800-0"), ("rollout", "h20-0")), "tcp://127.0.0.1:0",
                     str(tmp_path / "node.sock"), 60.0, "full")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "WEAVE_NODE_ALLOCATION_WATCH_S": "0.3"}
    return subprocess.Popen([sys.executable, "-m", "weave_slurm.sync.agent", spec.dumps()],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_an_agent_whose_allocation_ended_exits_while_it_waits_for_a_peer(
        tmp_path: Path) -> None:
    proc = _agent(tmp_path, "COMPLETED")
    try:
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"RENDEZVOUS tcp://127.0.0.1:")
    err = proc.stderr.read().decode()
    assert rc == 3, err
    assert "sync agent exits: its allocation no longer runs" in err


@pytest.fixture(autouse=True)
def _close_sockets() -> object:
    yield
    while _KEEP:
        _KEEP.pop().close()


def test_an_agent_whose_allocation_runs_stays(tmp_path: Path) -> None:
    proc = _agent(tmp_path, "RUNNING")
    try:
        time.sleep(3.0)    # ten checks of the watch
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)
