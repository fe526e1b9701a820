"""The zygote: a pre-started process that has imported torch (and the packages
node/preload.py names) and forks resident workers.

Started by the node daemon as ``python -m weave_slurm.node.zygote <fd>``, where ``fd``
is its end of a ``SOCK_SEQPACKET`` socket pair; ``python`` is the node daemon's own
interpreter (run as the daemon), or a job's own (run as that job's uid, importing weave
from the node daemon's installation: ``zygotes``). It imports torch and the worker side
(``resident``) once, then answers, single-threaded (fork is safe: no other Python
thread, no OpenMP region ever ran here):

    <- {"op": "fork", "seq": n, "job": id, "uid": u, "gid": g, "cwd": dir}
       with two fds (SCM_RIGHTS): the worker's socket end and its log file
    -> {"event": "forked", "seq": n, "pid": p}  or  {"event": "fork_failed", ...}
    -> {"event": "exit", "pid": p, "returncode": rc}       (rc < 0: killed by -rc)
    -> {"event": "ready", "pid": zygote pid}                 (once, at start)

The forked child makes itself a new session, points stdout/stderr at the log, closes
the zygote's socket (job code can never ask for a fork), drops to the job's uid and
gid (``setgroups([])``, ``setgid``, ``setuid``) *before* it touches any segment, asks
for SIGKILL when the zygote dies, and then serves phases (``resident.serve``).
At end of stream the zygote kills every worker it forked and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import select
import signal
import socket
import sys
import traceback
from typing import Any

from weave_slurm.node.seqpacket import receive, send

_PR_SET_PDEATHSIG = 1


def become(uid: int, gid: int) -> None:
    """Drop to ``uid``/``gid`` for good (no-op when already that uid)."""
    if os.geteuid() == uid:
        return
    if os.geteuid() != 0:
        raise PermissionError(f"zygote runs as uid {os.geteuid()}: cannot become {uid}")
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise PermissionError(f"setuid({uid}) did not stick")


def _child(ctl: socket.socket, wake_r: int, request: dict[str, Any], worker_fd: int,
           log_fd: int, zygote_pid: int) -> None:
    """In the forked child: isolate, drop privileges, serve phases. Never returns."""
    code = 0
    try:
        ctl.close()
        os.close(wake_r)
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        uid, gid = int(request["uid"]), int(request["gid"])
        become(uid, gid)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != zygote_pid:  # the zygote died before prctl took effect
            os._exit(1)
        with contextlib.suppress(KeyError):
            pw = pwd.getpwuid(uid)
            os.environ.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        os.chdir(str(request["cwd"]))
        from weave_slurm.node import resident

        resident.serve(socket.socket(fileno=worker_fd), str(request["job"]))
    except BaseException:  # the worker must never fall back into the zygote's loop
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fork(ctl: socket.socket, wake_r: int, request: dict[str, Any], fds: list[int],
          children: set[int]) -> None:
    seq = request.get("seq")
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        send(ctl, {"event": "fork_failed", "seq": seq, "message": "expected 2 fds"})
        return
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(ctl, wake_r, request, fds[0], fds[1], zygote_pid)
    for fd in fds:
        os.close(fd)
    children.add(pid)
    send(ctl, {"event": "forked", "seq": seq, "pid": pid})


def _warm_once() -> None:
    """Before the first fork: import what node/preload.py names (a zygote that forks
    nothing imports nothing more than torch)."""
    from weave_slurm.node import preload

    try:
        preload.warm()
    except Exception:  # a broken optional package: its jobs import it (and fail) alone
        traceback.print_exc()


def _reap(ctl: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        send(ctl, {"event": "exit", "pid": pid,
                   "returncode": os.waitstatus_to_exitcode(status)})


def run(ctl: socket.socket) -> None:
    """The zygote's loop: fork on request, report exits, stop at end of stream."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    children: set[int] = set()
    send(ctl, {"event": "ready", "pid": os.getpid()})
    try:
        while True:
            readable, _, _ = select.select([ctl.fileno(), wake_r], [], [], 1.0)
            if wake_r in readable:
                os.read(wake_r, 4096)
            if ctl.fileno() in readable:
                request, fds = receive(ctl)
                if request is None:
                    return
                if request.get("op") == "fork":
                    _warm_once()
                    _fork(ctl, wake_r, request, fds, children)
                else:
                    for fd in fds:
                        os.close(fd)
            _reap(ctl, children)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[0].startswith("unix:"):   # in a container: no descriptor is passed in
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ctl.connect(args[0].removeprefix("unix:"))
    else:
        ctl = socket.socket(fileno=int(args[0]))
    import torch  # noqa: F401  (the point of a zygote: import once, fork many)

    from weave_slurm.node import resident  # noqa: F401


    try:
        run(ctl)
    except (BrokenPipeError, ConnectionResetError):
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
