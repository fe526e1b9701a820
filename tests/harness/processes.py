"""Processes in tests: is a pid alive, which pid a job's resident worker has, whether
the node daemons and workers of a state dir are gone, and which processes still carry
a Slurm cluster's config."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.waits import settle
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie is dead too)."""
    try:
        os.kill(pid, 0)
        # the process may be reaped between the two looks: ESRCH or ENOENT then
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


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
    pids = settle(lambda: pids_naming(marker), timeout_s, interval_s=0.5,
                  until=lambda pids: not pids)
    for pid in pids:
        with contextlib.suppress(OSError):
            print(pid, Path(f"/proc/{pid}/cmdline").read_bytes(),
                  Path(f"/proc/{pid}/stat").read_text().split()[3])
    return not pids


def pids_naming(marker: Path) -> list[str]:
    """The pids of the processes whose command line names ``marker``."""
    return subprocess.run(["pgrep", "-f", str(marker)], capture_output=True,
                          text=True).stdout.split()


def run_as(uid: int, fn: Callable[[], str]) -> str:
    """Fork, drop to ``uid`` (os.setuid), run ``fn`` and return what it returned.

    Exceptions come back as their class name, so a test can expect "PermissionError".
    A fork, not a fresh interpreter: other uids cannot read this machine's Python.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = fn()
        except BaseException as exc:
            out = type(exc).__name__ + ": " + str(exc)
        os.write(write_fd, out.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


def carrying_conf(slurm_conf: Path) -> dict[int, str]:
    """pid -> command name of every live process (this one excepted) whose environment
    says ``SLURM_CONF=<slurm_conf>``: a step, task or client of that cluster."""
    want = f"SLURM_CONF={slurm_conf}".encode()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if want in entry.joinpath("environ").read_bytes().split(b"\0") \
                    and pid_alive(int(entry.name)):
                out[int(entry.name)] = entry.joinpath("comm").read_text().strip()
    return out
