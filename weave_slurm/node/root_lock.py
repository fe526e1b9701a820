"""The node daemon's hold on its root: one daemon serves a store root at a time.

A daemon takes its root's lock file (``.daemon.lock``, ``flock``) at start and keeps it
for its life. It removes the lock file only when it gives the root up for good, **last,
while it still holds it**, and touches nothing in the root after that: at a stop with
nothing registered (the end of its shutdown), or when its allocation has ended (at once:
it then refuses every request while its workers stop, ``NodeDaemon.ended``). A lock
file removed by a daemon that goes on using the root would let a second daemon create
and lock a new one and serve the root beside it, and the first one's stop would then
remove the second one's jobs. That happens on a real cluster: a node's allocation ends
(node failure, the group's allocation replaced) and weaved's next allocation starts a
daemon on the same host, with the same root and socket path, while the old daemon
still stops its workers (seen in tests/reliability/test_chaos.py).

So a starting daemon waits for the lock (``wait_s``; its holder is stopping), and, once
it has it, checks that the file it locked is still the root's lock file: one whose
holder removed it meanwhile is not, and the daemon takes the root's new one instead.
A daemon removes its socket only if the file at that path is still the one it bound
(:func:`remove_own`).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

NAME = ".daemon.lock"


class RootLock:
    """The lock file of one store root (not thread-bound: a signal's stop thread
    releases what the main thread took)."""

    POLL_S = 0.1

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float, on_wait: Callable[[], None] | None = None) -> bool:
        """Take the lock, waiting up to ``wait_s`` for its holder to let go (``on_wait``
        is called once, when that wait begins); False if it did not in time."""
        deadline = time.monotonic() + wait_s
        waiting = False
        while True:
            self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
            took = self._try_take()
            if took:
                return True
            if took is None:     # its holder removed the file we locked: take the new one
                continue
            if time.monotonic() >= deadline:
                return False
            if not waiting and on_wait is not None:
                on_wait()
            waiting = True
            time.sleep(self.POLL_S)

    def _try_take(self) -> bool | None:
        """One try: True, the root's lock file is held now; False, another daemon holds
        it (or the root went between mkdir and open): wait; None, the file locked was
        removed by its holder meanwhile: try again at once."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if self._is_current(fd):
            self._fd = fd
            return True
        os.close(fd)
        return None

    def _is_current(self, fd: int) -> bool:
        held = os.fstat(fd)
        return file_id(self.path) == (held.st_dev, held.st_ino)

    def release(self, remove: bool = False) -> None:
        """Let go of the root; with ``remove``, its lock file goes first (while held)."""
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        fd, self._fd = self._fd, None
        os.close(fd)


def file_id(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode); None if there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def remove_own(path: Path, own: tuple[int, int] | None) -> None:
    """Remove ``path`` if it is still the file ``own`` names (not a newer daemon's)."""
    if own is not None and file_id(path) == own:
        path.unlink(missing_ok=True)
