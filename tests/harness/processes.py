"""Processes in tests: is a pid alive, which pid a job's resident worker has, and
whether the node daemons and workers of a state dir are gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.harness.waits import settle
from weave_slurm.node.client import NodeClient
from weave_slurm.node.protocol import Op


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie is dead too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def node_status(sock: Path) -> dict[str, Any]:
    """The ``status`` reply of the node daemon listening on ``sock``."""
    with NodeClient(sock, timeout_s=5.0) as client:
        return dict(client.call(Op.STATUS))


def worker_pid(sock: Path, job_id: str) -> int | None:
    """The pid of ``job_id``'s resident worker on the node daemon at ``sock`` (or None)."""
    for job in node_status(sock)["jobs"]:
        if job["job"] == job_id and job.get("resident"):
            pid = job["resident"].get("pid")
            return int(pid) if pid else None
    return None


def kill_worker(sock: Path, job_id: str) -> int:
    """SIGKILL ``job_id``'s resident worker on the node daemon at ``sock``; its pid."""
    pid = worker_pid(sock, job_id)
    assert pid is not None, f"job {job_id} has no resident worker on {sock}"
    os.kill(pid, signal.SIGKILL)
    return pid


def daemons_gone(marker: Path, timeout_s: float) -> bool:
    """True once no process's command line names ``marker`` (node daemons and their
    workers name their checkpoint root); after ``timeout_s``, prints them and is False."""
    pids = settle(lambda: _pids_naming(marker), timeout_s, interval_s=0.5,
                  until=lambda pids: not pids)
    for pid in pids:
        with contextlib.suppress(OSError):
            print(pid, Path(f"/proc/{pid}/cmdline").read_bytes(),
                  Path(f"/proc/{pid}/stat").read_text().split()[3])
    return not pids


def _pids_naming(marker: Path) -> list[str]:
    return subprocess.run(["pgrep", "-f", str(marker)], capture_output=True,
                          text=True).stdout.split()
