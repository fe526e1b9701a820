"""A cooperative role's launcher: the role's line runs under a child subreaper.

The node daemon starts each role of a cooperative job (``launch``) as
``python -I -S reaper.py [--as UID:GID:GROUPS] -- ARGV...`` (with its own interpreter,
which the job's uid may not be allowed to run). This process marks itself a *child
subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every descendant of the role that
daemonizes (``ray start --head`` forks its GCS and raylet, then exits; ``setsid``,
double forks) is re-parented to it, not to pid 1: the role's whole process tree stays
under it, whatever sessions and process groups its members make. With ``--as`` it then
takes the job's uid, gid and groups (the mark stays), before it starts ``ARGV``.

- **The role's end.** When the main child (``ARGV``) exits, every descendant still
  running is stopped (SIGTERM, SIGKILL after :data:`TERM_GRACE_S`), then this process
  exits with the main child's status (a signal death is repeated on itself, so the
  daemon reads the same status as without it).
- **A stop.** SIGTERM, SIGINT or SIGHUP (the daemon's ``stop``) is passed to every
  descendant, then the same sweep.

Standalone on purpose: stdlib only, run with ``-I -S`` so that neither the job's
environment (``PYTHONPATH``) nor site-packages are read before the role starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36
#: Descendants get SIGTERM, then SIGKILL after this (under the daemon's STOP_GRACE_S).
TERM_GRACE_S = 1.5
#: Longest time spent SIGKILLing descendants that keep forking.
KILL_LIMIT_S = 5.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    """Raised by the stop signals' handler, so a blocking wait returns."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signum)


def descendants(root: int) -> list[int]:
    """Pids of ``root``'s descendants, as /proc says now (children first)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()   # after "pid (comm) "
        if fields[0] != b"Z":                             # a zombie holds nothing
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap_zombies() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def sweep(root: int, term_grace_s: float = TERM_GRACE_S) -> None:
    """Stop every descendant of ``root``: SIGTERM, then SIGKILL until none is left."""
    _signal_all(descendants(root), signal.SIGTERM)
    end = time.monotonic() + term_grace_s
    while descendants(root) and time.monotonic() < end:
        _reap_zombies()
        time.sleep(0.05)
    end = time.monotonic() + KILL_LIMIT_S
    while (left := descendants(root)) and time.monotonic() < end:
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.02)
        _reap_zombies()
    _reap_zombies()


def _wait_main(pid: int) -> int:
    """The main child's wait status, reaping re-parented orphans meanwhile."""
    while True:
        got, status = os.waitpid(-1, 0)
        if got == pid:
            return status


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1)


def command_line(argv: list[str], uid: int | None = None, gid: int = 0,
                 groups: list[int] | None = None) -> list[str]:
    """This launcher's arguments for ``argv`` (run as ``uid`` when given)."""
    ids = [] if uid is None else ["--as", f"{uid}:{gid}:{','.join(map(str, groups or []))}"]
    return [*ids, "--", *argv]


def _become(ids: str) -> None:
    uid, gid, groups = ids.split(":")
    os.setgroups([int(g) for g in groups.split(",") if g])
    os.setgid(int(gid))
    os.setuid(int(uid))
    try:
        os.chdir(".")     # the working directory, as the job's uid may enter it
    except OSError as exc:
        sys.exit(f"reaper: cannot enter {os.getcwd()!r} as uid {uid}: {exc.strerror}")


def main(args: list[str]) -> None:
    ids = None
    if args[:1] == ["--as"] and len(args) > 1:
        ids, args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        sys.exit("reaper: usage: reaper.py [--as UID:GID:GROUPS] -- ARGV...")
    argv = args[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"reaper: prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    if ids is not None:
        _become(ids)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    try:
        status = _wait_main(pid)
    except _Stop as stop:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        sweep(me)
        signal.signal(stop.signum, signal.SIG_DFL)
        os.kill(me, stop.signum)
        sys.exit(128 + stop.signum)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    sweep(me)
    _exit_as(status)


if __name__ == "__main__":
    main(sys.argv[1:])
