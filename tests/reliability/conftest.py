"""Fixtures of the reliability suite: the daemon tests' fixtures (re-exported, not copied)
and two real Unix users for the isolation tests."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.daemon.conftest import public_dir, weaved
from tests.harness.scratch import python_open_to_users
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


@contextmanager
def made_users() -> Iterator[tuple[TestUser, TestUser]]:
    """``weave-test-a`` and ``weave-test-b``, created with useradd if absent and removed
    at the end (only the ones created here); also for bench/chaos.py."""
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
    try:
        yield users[0], users[1]
    finally:
        for name in created:
            subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture(scope="session")
def test_users() -> Iterator[tuple[TestUser, TestUser]]:
    """:func:`made_users` for the session (skipped without root or useradd)."""
    if not shutil.which("useradd"):
        pytest.skip("useradd is not installed")
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to create users")
    with made_users() as users:
        yield users


@pytest.fixture
def python_for_users() -> Iterator[list[str]]:
    """This interpreter's standard library reachable by other uids for one test
    (tests/harness/scratch.py, ``python_open_to_users``)."""
    with python_open_to_users() as changed:
        yield changed
