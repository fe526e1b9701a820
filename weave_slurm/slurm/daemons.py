"""Processes of the local cluster: start its daemons, find them again, stop them;
find and end everything else of the cluster (steps, tasks, sruns).

Each daemon runs in the foreground of its own session and is recorded in a pid
file (JSON: pid, kernel start time, argv). The start time guards against pid
reuse: :func:`stop` only ever signals the exact process it started.

The other processes of a cluster are found in ``/proc`` (:func:`clients_of`): a
process whose environment names this cluster's ``slurm.conf`` in ``SLURM_CONF`` and
that is a Slurm program (slurmstepd, srun, salloc, ...) or a job's task (Slurm put
``SLURM_JOB_ID`` there), and every descendant of one; never the caller or its
ancestors. :func:`sweep` ends whatever a finder returns: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from weave_slurm.errors import StateError

log = logging.getLogger(__name__)

#: Slurm's own programs: one run with a cluster's SLURM_CONF belongs to that cluster
SLURM_PROGRAMS = frozenset({"slurmstepd", "srun", "salloc", "sbatch", "sattach", "sbcast"})
_KILL_WAIT_S = 5.0   # how long a SIGKILLed process may take to disappear


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


# -- the other processes of a cluster ------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One live process as ``/proc/<pid>/stat`` shows it."""

    pid: int
    ppid: int
    ticks: int
    comm: str


def process_table() -> dict[int, Proc]:
    """Every live process of the machine (zombies left out: they are dead already)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X"):
            pid = int(entry.name)
            out[pid] = Proc(pid, int(fields[1]), int(fields[19]),
                            raw[raw.index("(") + 1:raw.rindex(")")])
    return out


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with; empty if it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def _names_conf(pid: int, value: str, conf: str) -> bool:
    """True if ``SLURM_CONF=value`` of ``pid`` is the file ``conf`` (a relative path is
    taken from the process's working directory)."""
    if value == conf:
        return True
    with contextlib.suppress(OSError):
        if not os.path.isabs(value):
            value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
        return os.path.realpath(value) == conf
    return False


def ancestry(pid: int, table: dict[int, Proc]) -> set[int]:
    """``pid`` and every ancestor of it."""
    out = set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid].ppid
    return out


def clients_of(slurm_conf: Path, table: dict[int, Proc] | None = None,
               spare: Collection[int] = ()) -> dict[int, Proc]:
    """The processes of the cluster whose config is ``slurm_conf``, besides its daemons.

    A Slurm program (:data:`SLURM_PROGRAMS`) or a job's task (``SLURM_JOB_ID`` in its
    environment) whose ``SLURM_CONF`` is this file, and every descendant of one (a task
    that cleared its environment, srun's helper child). Never the caller, its
    ancestors or the pids in ``spare`` (the recorded daemons, stopped in order).
    """
    table = process_table() if table is None else table
    conf = os.path.realpath(slurm_conf)
    keep = ancestry(os.getpid(), table) | set(spare)
    roots = []
    for pid, proc in table.items():
        if pid in keep:
            continue
        env = environ(pid)
        value = env.get("SLURM_CONF")
        if value and (proc.comm in SLURM_PROGRAMS or "SLURM_JOB_ID" in env) \
                and _names_conf(pid, value, conf):
            roots.append(pid)
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid not in found and pid not in keep:
            found.add(pid)
            roots.extend(children.get(pid, ()))
    return {pid: table[pid] for pid in found}


Finder = Callable[[], dict[int, tuple[int, str]]]


def sweep(find: Finder, daemon_pids: Collection[int] = (), grace_s: float = 10.0,
          stray_grace_s: float = 1.0, what: str = "the cluster") -> dict[int, str]:
    """End every process ``find`` returns (pid -> (start ticks, where)): SIGTERM, then
    SIGKILL.

    The recorded daemons (``daemon_pids``) get ``grace_s`` to exit; any other process
    (slurmstepd ignores SIGTERM; tasks, sruns) ``stray_grace_s``, as Slurm's own
    KillWait does. Asks ``find`` again until it returns nothing (a process may fork
    while it is being stopped). Returns pid -> where of every process it signalled.
    """
    seen: dict[int, str] = {}
    killed: set[int] = set()
    t0 = time.monotonic()
    while True:
        live = {pid: v for pid, v in find().items()   # a Popen may own the others
                if process_alive(pid, v[0], reap=pid in daemon_pids)}
        if not live:
            return seen
        elapsed = time.monotonic() - t0
        if elapsed > max(grace_s, stray_grace_s) + _KILL_WAIT_S:
            pid, (_, where) = next(iter(live.items()))
            raise StateError(f"{what}: pid {pid} on {where} survives SIGKILL; "
                             f"{len(live)} processes of it left")
        for pid, (_, where) in live.items():
            hard = elapsed >= (grace_s if pid in daemon_pids else stray_grace_s)
            if pid in killed or (pid in seen and not hard):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
            seen[pid] = where
            if hard:
                killed.add(pid)
        time.sleep(0.05)
