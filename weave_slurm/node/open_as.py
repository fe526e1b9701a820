"""A file opened as another uid: by a child that became that uid for good, the
descriptor passed back over a socket pair (``SCM_RIGHTS``). Root (weaved, a node
daemon) never opens a user's file as root: the kernel decides as the user would.

The child runs only the id calls, ``open`` and ``sendmsg`` (no lock another thread may
hold), then ``_exit``, so it is safe to fork from a threaded daemon.
"""

from __future__ import annotations

import array
import contextlib
import os
import pwd
import socket
from collections.abc import Sequence

FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOCTTY


def open_as(uid: int, path: str, gid: int | None = None,
            groups: Sequence[int] = ()) -> int:
    """``path`` opened ``O_WRONLY|O_APPEND|O_CREAT`` (0644) as ``uid`` (``gid``: its
    primary group, default its passwd entry's; ``groups``: its supplementary groups,
    default none); a descriptor, or ``OSError`` naming the path. Without root (a daemon
    running as the job's own user) it opens here."""
    if os.geteuid() != 0 or uid == 0:
        return os.open(path, FLAGS, 0o644)
    if gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    pid = os.fork()
    if pid == 0:   # pragma: no cover (the child; its descriptor is what the tests check)
        code = 1
        try:
            ours.close()
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                fd = os.open(path, FLAGS, 0o644)
                theirs.sendmsg([b"0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                         array.array("i", [fd]))])
            except OSError as exc:
                theirs.send(str(exc.errno).encode())
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        ours.settimeout(10.0)
        msg, fds, _, _ = socket.recv_fds(ours, 64, 1)
    finally:
        ours.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if msg == b"0" and fds:
        return fds[0]
    code = int(msg) if msg.isdigit() else 1
    raise OSError(code, f"{os.strerror(code)} (opened as uid {uid})", path)
