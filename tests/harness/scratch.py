"""Scratch directories of the tests that other uids (node daemons, workers, the users
of the multi-user tests) must reach: pytest's own tmp dirs are 0700."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def public_dir(prefix: str) -> Iterator[Path]:
    """A temp directory every uid can list and traverse (0755), removed at the end."""
    with _scratch(prefix, None, 0o755) as path:
        yield path


@contextmanager
def shm_dir(prefix: str) -> Iterator[Path]:
    """A directory in /dev/shm every uid can traverse but not list (0711), removed at
    the end: the shared-memory root of node daemons."""
    with _scratch(prefix, "/dev/shm", 0o711) as path:
        yield path


@contextmanager
def _scratch(prefix: str, parent: str | None, mode: int) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def python_open_to_users() -> Iterator[list[str]]:
    """Let other uids reach this interpreter's standard library while inside.

    Workers that drop to a job's uid import modules lazily, so that uid must be able to
    read Python (on a site it lives in /usr or a shared prefix). Here it may sit under a
    0700 home: each such ancestor of ``sys.base_prefix`` gets o+x (traverse, not list)
    and its old mode back after. Yields the directories changed."""
    with open_to_users(Path(sys.base_prefix)) as changed:
        yield changed


@contextmanager
def open_to_users(path: Path) -> Iterator[list[str]]:
    """Let other uids traverse to ``path`` while inside: each ancestor without o+x gets
    it, and its old mode back after. Yields the directories changed."""
    changed: list[tuple[Path, int]] = []
    for d in reversed(path.resolve().parents):
        mode = stat.S_IMODE(d.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(d, mode | stat.S_IXOTH)
            changed.append((d, mode))
    try:
        yield [str(d) for d, _ in changed]
    finally:
        for d, mode in changed:
            os.chmod(d, mode)
