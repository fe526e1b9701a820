"""Fixtures of the reliability suite: the daemon tests' fixtures (re-exported, not copied)
and two real Unix users for the isolation tests."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.daemon.conftest import public_dir, weaved
from tests.runtime.conftest import rl_weaved

__all__ = ["public_dir", "python_for_users", "rl_weaved", "test_users", "weaved"]

USER_NAMES = ("weave-test-a", "weave-test-b")


@dataclass(frozen=True)
class TestUser:
    __test__ = False  # not a test class, despite its name

    name: str
    uid: int
    gid: int
    home: str


@pytest.fixture(scope="session")
def test_users() -> Iterator[tuple[TestUser, TestUser]]:
    """``weave-test-a`` and ``weave-test-b``, created with useradd if absent and removed
    at the end (only the ones this session created)."""
    if not shutil.which("useradd"):
        pytest.skip("useradd is not installed")
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to create users")
    created = []
    for name in USER_NAMES:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            created.append(name)
    users = tuple(TestUser(p.pw_name, p.pw_uid, p.pw_gid, p.pw_dir)
                  for p in (pwd.getpwnam(n) for n in USER_NAMES))
    yield users[0], users[1]
    for name in created:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture
def python_for_users() -> Iterator[list[str]]:
    """Let other uids reach this interpreter's standard library for one test.

    Workers that drop to a job's uid import modules lazily, so that uid must be able to
    read Python (on a site it lives in /usr or a shared prefix). Here it may sit under a
    0700 home: each such ancestor of ``sys.base_prefix`` gets o+x (traverse, not list)
    for the test and its old mode back after. Yields the directories changed.
    """
    import os
    import stat
    import sys
    from pathlib import Path

    changed: list[tuple[Path, int]] = []
    for d in reversed(Path(sys.base_prefix).resolve().parents):
        mode = stat.S_IMODE(d.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(d, mode | stat.S_IXOTH)
            changed.append((d, mode))
    try:
        yield [str(d) for d, _ in changed]
    finally:
        for d, mode in changed:
            os.chmod(d, mode)
