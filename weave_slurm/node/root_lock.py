"""The node daemon's hold on its root: one daemon serves a store root at a time.

A daemon takes its root's lock file (``.daemon.lock``, ``flock``) at start and keeps it
for its life. It may remove the root when it stops with nothing to keep, or when its
allocation has ended; it then removes the lock file **last, while it still holds it**:
a lock file removed earlier would let a second daemon create and lock a new one and
serve the root beside the first, whose stop would then remove the second one's jobs.
That happens on a real cluster: a node's allocation ends (node failure, the group's
allocation replaced) and weaved's next allocation starts a daemon on the same host,
with the same root, while the old daemon still stops its workers.

So a starting daemon waits for the lock (``wait_s``; its holder is stopping), and, once
it has it, checks that the file it locked is still the root's lock file: one whose
holder removed it meanwhile is not, and the daemon takes the root's new one instead.
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
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:     # the root went between mkdir and open
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    return False
                if not waiting and on_wait is not None:
                    on_wait()
                waiting = True
                time.sleep(self.POLL_S)
                continue
            if self._is_current(fd):
                self._fd = fd
                return True
            os.close(fd)     # its holder removed it while we waited: not the root's lock

    def _is_current(self, fd: int) -> bool:
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def release(self, remove: bool = False) -> None:
        """Let go of the root; with ``remove``, its lock file goes first (while held)."""
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        fd, self._fd = self._fd, None
        os.close(fd)
