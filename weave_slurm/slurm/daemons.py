"""Daemon processes of the local cluster: start them, find them again, stop them.

Each daemon runs in the foreground of its own session and is recorded in a pid
file (JSON: pid, kernel start time, argv). The start time guards against pid
reuse: :func:`stop` only ever signals the exact process it started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from weave_slurm.errors import StateError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonRecord:
    """One started daemon, as written to its pid file."""

    name: str
    pid: int
    start_ticks: int
    argv: tuple[str, ...]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our exited child (else it stays a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start_ticks(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot), None if it is gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def process_alive(pid: int, ticks: int, *, reap: bool = False) -> bool:
    """True while ``pid`` runs and is the process that started at ``ticks``.

    A zombie counts as dead. ``reap`` collects it if it is our child: only for
    processes no ``Popen`` object owns (that would lose the exit code Popen reports).
    """
    if reap:
        _reap(pid)
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == ticks


def is_alive(record: DaemonRecord) -> bool:
    """True while the recorded process (same pid AND start time) runs."""
    return process_alive(record.pid, record.start_ticks, reap=True)


def start(name: str, argv: Sequence[str], *, pid_file: Path, log_file: Path,
          user: str | None = None, env: dict[str, str] | None = None) -> DaemonRecord:
    """Start ``argv`` (a foreground daemon) detached, and record it in ``pid_file``."""
    args = [str(a) for a in argv]
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as sink:
        try:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    user=user, env=env)
        except OSError as exc:
            raise StateError(f"cannot start {name}: {' '.join(args)}: {exc}") from exc
    stat = _proc_stat(proc.pid)
    record = DaemonRecord(name, proc.pid, stat[1] if stat else 0, tuple(args))
    pid_file.write_text(json.dumps(asdict(record)) + "\n")
    log.info("started %s pid %d", name, proc.pid)
    return record


def read(pid_file: Path) -> DaemonRecord | None:
    """The record in ``pid_file``; None if the file is missing or unreadable."""
    try:
        data = json.loads(pid_file.read_text())
        return DaemonRecord(str(data["name"]), int(data["pid"]), int(data["start_ticks"]),
                            tuple(str(a) for a in data["argv"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop(record: DaemonRecord, *, timeout_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout_s``; True if the process had been running."""
    if not is_alive(record):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(record):
            return True
        time.sleep(0.05)
    log.warning("%s pid %d ignored SIGTERM for %.1f s; sending SIGKILL",
                record.name, record.pid, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while is_alive(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def log_tail(log_file: Path, lines: int = 5) -> str:
    """The last lines of a daemon's log, joined with ' | ' for one-line errors."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"
