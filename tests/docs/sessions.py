"""Where a page's command blocks run: one shell session per section (or per page), in
a directory that looks like the repository root to them, with a fresh user's shell
environment.

README.md's commands are typed "from the repository root": they run in a scratch
directory whose ``.venv``, ``configs`` and ``Makefile`` are links to the checkout's, so
that the ``.state/`` (weaved's socket and store, the cluster's files), ``plan.json``
and ``out/`` they write stay out of the checkout. docs/deploy.md's commands build a
wheel "in the sources": they run in a copy of them.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.docs.blocks import REPO, DocBlock
from tests.docs.shell import ShellSession

#: What a fresh login shell would not have: the test run's own venv, socket and cluster.
_DROP = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SLURM_CONF", "MUNGE_SOCKET",
         "WEAVE_DAEMON_SOCKET", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment as a user's new shell has it: no venv on PATH."""
    venv_bin = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin")
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":")
                           if p and p != venv_bin and not p.startswith(str(REPO / ".venv")))
    for name in ("USER", "LOGNAME"):   # a login shell has them; pytest's children may not
        env.setdefault(name, getpass.getuser())
    env.update(extra or {})
    return env


def repo_view(dest: Path) -> Path:
    """A directory that holds links to the checkout's venv, configs, script templates and
    Makefile."""
    dest.mkdir(parents=True)
    for name in (".venv", "configs", "sbatch_templates", "Makefile"):
        (dest / name).symlink_to(REPO / name)
    return dest


def sources_copy(dest: Path) -> Path:
    """A copy of what a wheel is built from, plus the configs (no constraints file: a
    site installing the wheel needs nothing else from the sources)."""
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "weave_slurm", dest / "weave_slurm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copytree(REPO / "configs", dest / "configs")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    return dest


class Sessions:
    """The open shell sessions of a test module, by key; each started on first use."""

    def __init__(self, base: Path, cwd_for: dict[str, Path], env: dict[str, str]) -> None:
        self.base, self.cwd_for, self.env = base, cwd_for, env
        self.open: dict[str, ShellSession] = {}

    def key(self, block: DocBlock) -> str:
        return block.doc if block.doc in self.cwd_for else f"{block.doc}#{block.section}"

    def of(self, block: DocBlock) -> ShellSession:
        key = self.key(block)
        if key not in self.open:
            n = len(self.open)
            cwd = self.cwd_for.get(block.doc) or repo_view(self.base / f"repo{n}")
            self.open[key] = ShellSession(self.base / f"session{n}", cwd, self.env)
        return self.open[key]

    def close(self) -> None:
        for s in self.open.values():
            s.close()


@contextmanager
def sessions(factory: pytest.TempPathFactory, name: str, env: dict[str, str],
             cwd_for: dict[str, Path] | None = None) -> Iterator[Sessions]:
    s = Sessions(factory.mktemp(name), cwd_for or {}, env)
    try:
        yield s
    finally:
        s.close()


def run_block(s: Sessions, block: DocBlock, timeout_s: float = 600.0) -> str:
    """Run ``block`` in its session; fail naming every command of it that failed, or
    its output if it differs from the page's expected output. Returns the output."""
    res = s.of(block).run(block.code, timeout_s)
    where = f"{block.where} ({block.section})"
    assert not res.failures and res.rc == 0, (
        f"{where}: exit {res.rc}; failed: {res.failures}\n--- block ---\n{block.code}"
        f"--- output ---\n{res.output[-6000:]}")
    if block.expected_output is not None:
        squeeze = block.expected_output_ignore_whitespace   # as pytest-codeblocks compares
        got, shown = ((re.sub(r"\s+", "", s) if squeeze else s)
                      for s in (res.output, block.expected_output))
        assert got == shown, (
            f"{where}: printed\n{res.output}\nwhere the page shows\n{block.expected_output}")
    return res.output
