"""Scratch directories of the tests that other uids (node daemons, workers, the users
of the multi-user tests) must reach: pytest's own tmp dirs are 0700."""

from __future__ import annotations

import shutil
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
