"""A cooperative role's whole process tree ends with it (node/reaper.py under the node
daemon's ``launch``): a descendant that daemonizes (its own session, re-parented away,
as ``ray start --head`` leaves its GCS and raylet) is stopped when the role's line exits
and when weave stops the job; the role's exit status is the line's own."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import pid_alive
from tests.harness.waits import wait_for
from weave_slurm.node import reaper
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op


def _call(sock: Path, op: Op, **args: Any) -> dict[str, Any]:
    with NodeClient(sock) as client:
        return client.call(op, **args)


def _tagged(tag: str) -> list[int]:
    """Pids whose command line holds ``tag``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_alive(int(entry.name)):
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _daemonizing(tag: str, then: str) -> str:
    """A line that leaves a daemon of its own session behind (its parent exits), then
    runs ``then``; the daemon's command line carries ``tag``."""
    return f"(setsid sleep 600 {tag} & ) ; {then}"


def test_a_daemonized_descendant_ends_when_the_roles_line_exits(node: Any) -> None:
    sock, tag = node.config.socket, f"w{uuid.uuid4().hex[:8]}"
    _call(sock, Op.REGISTER, job="r1")
    _call(sock, Op.LAUNCH, job="r1", action="start", role="train",
          command=_daemonizing(tag, "sleep 0.5"))
    wait_for(lambda: _tagged(tag), 10, "the daemon started")

    def ended() -> int | None:
        rc = _call(sock, Op.PHASE, job="r1")["gate"]["procs"]["train"]["returncode"]
        return None if rc is None else int(rc)
    assert wait_for(ended, 15, "the role's line exited", until=lambda rc: rc is not None) == 0
    wait_for(lambda: not _tagged(tag), 10, "no process of the role left")


@pytest.mark.parametrize("how", ["stop", "drop"])   # weave's stop; a cancel's drop
def test_a_stop_ends_the_roles_daemonized_descendants(node: Any, how: str) -> None:
    sock, tag = node.config.socket, f"w{uuid.uuid4().hex[:8]}"
    _call(sock, Op.REGISTER, job="r2")
    _call(sock, Op.LAUNCH, job="r2", action="start", role="rollout",
          command=_daemonizing(tag, "sleep 600"))
    wait_for(lambda: _tagged(tag), 10, "the daemon started")
    if how == "stop":
        _call(sock, Op.LAUNCH, job="r2", action="stop")
    else:
        _call(sock, Op.DROP, job="r2")
    wait_for(lambda: not _tagged(tag), 10, "no process of the role left")


def test_the_launcher_exits_as_its_line_did() -> None:
    run = [sys.executable, "-I", "-S", reaper.__file__, "--", "/bin/sh", "-c"]
    assert subprocess.run([*run, "exit 7"], check=False).returncode == 7
    assert subprocess.run([*run, "kill -TERM $$"], check=False).returncode == \
        -signal.SIGTERM
