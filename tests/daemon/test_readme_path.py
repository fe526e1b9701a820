"""README's path on the separate-hosts cluster, typed as a user types it (issue 30).

Nothing of the test's own: the exports come from ``weave cluster env`` (what ``weave
cluster up`` prints), weaved runs ``--backend slurm --site configs/site.example.toml``
as shipped, and the three shipped examples are submitted with ``weave-sbatch`` as
they are. Each runs at its declared layout (8 training ranks, 8 rollout engines on
CPU), weaved is killed with SIGKILL once every job has made progress, started again
with the same command, and every job completes. The command lines are the README's.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.weaved import release_all
from tests.slurm.session_cluster import REPO, SessionCluster
from weave_slurm.daemon.membership import instance_tag, name_prefix
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = pytest.mark.slurm

EXAMPLES = ("qwen3b-grpo-4k", "qwen7b-grpo-4k", "qwen7b-grpo-8k")
BIN = Path(sys.executable).parent     # the venv a user activates (`. .venv/bin/activate`)


def _shell_env(home: Path) -> dict[str, str]:
    """A fresh login shell with the venv active: no variable of the test's own."""
    return {"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 120) -> str:
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    assert res.returncode == 0, f"{' '.join(argv)}: exit {res.returncode}: {res.stderr}"
    return res.stdout


def _exports(text: str) -> dict[str, str]:
    """``export KEY=VALUE`` lines, as ``eval`` would take them."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = shlex.split(value)[0]
    return out


class User:
    """A shell in a working directory holding the repository's ``configs/``."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.daemon: subprocess.Popen[bytes] | None = None

    def weave(self, *args: str) -> str:
        return _run(["weave", *args], self.cwd, self.env)

    def start_weaved(self) -> None:
        sock = self.cwd / ".state" / "weaved" / "weaved.sock"
        sock.unlink(missing_ok=True)
        log = (self.cwd / "weaved.log").open("ab")
        self.daemon = subprocess.Popen(
            ["weave", "daemon", "--backend", "slurm", "--site", "configs/site.example.toml"],
            cwd=self.cwd, env=self.env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert self.daemon.poll() is None, f"weaved exited: {self.log_tail()}"
            assert time.monotonic() < deadline, f"no socket in 60 s: {self.log_tail()}"
            time.sleep(0.2)

    def log_tail(self) -> str:
        return "\n".join((self.cwd / "weaved.log").read_text().splitlines()[-5:])

    def jobs(self) -> list[dict[str, Any]]:
        rows: Any = json.loads(self.weave("status", "-a", "--json"))
        return rows if isinstance(rows, list) else list(rows.get("jobs", []))

    def wait(self, done: Any, what: str, timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.jobs()
            if done(rows):
                return rows
            failed = [r for r in rows if r["state"] in ("FAILED", "CANCELLED")]
            assert not failed, f"{what}: {failed}"
            assert time.monotonic() < deadline, \
                f"{what}: not within {timeout_s:.0f} s: {rows}\n{self.log_tail()}"
            time.sleep(3)


@pytest.fixture
def user(slurm_cluster: SessionCluster, tmp_path: Path) -> Iterator[User]:
    env = _shell_env(tmp_path)
    env.update(_exports(_run(["weave", "cluster", "env", "--state-dir",
                              str(slurm_cluster.cluster.paths.state_dir)], tmp_path, env)))
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    u = User(work, env)
    try:
        yield u
    finally:
        with_daemon = u.daemon is not None and u.daemon.poll() is None
        if with_daemon:
            ids = [str(r["job"]) for r in u.jobs() if r["state"] not in
                   ("COMPLETED", "FAILED", "CANCELLED")]
            if ids:
                subprocess.run(["weave", "cancel", *ids], cwd=work, env=env, timeout=60)
                time.sleep(5)
            assert u.daemon is not None
            os.killpg(u.daemon.pid, signal.SIGTERM)
            u.daemon.wait(timeout=60)
        # weaved without --instance: its allocations are tagged 'default'
        release_all(SlurmCliBackend(env=env), name_prefix(""), instance_tag(""))


def test_the_shipped_examples_complete_through_readmes_path_across_a_kill_9(
        user: User) -> None:
    exported = set(user.env) - set(_shell_env(Path("/")))
    assert exported == {"SLURM_CONF", "MUNGE_SOCKET"}, exported
    user.start_weaved()
    ids = []
    for name in EXAMPLES:
        out = _run(["weave-sbatch", f"configs/jobs/{name}.toml"], user.cwd, user.env)
        assert out.startswith("Submitted weave job "), out
        ids.append(int(out.split()[-1]))
    user.wait(lambda rows: all(r["state"] == "COMPLETED" or (r.get("iter") or "0/").split(
        "/")[0] not in ("", "0") for r in rows) and len(rows) == 3,
        "every job's first training step", 900)
    assert user.daemon is not None
    user.daemon.send_signal(signal.SIGKILL)
    user.daemon.wait(timeout=30)
    user.start_weaved()
    rows = user.wait(lambda rows: all(r["state"] == "COMPLETED" for r in rows),
                     "every job completed after the kill -9", 900)
    assert sorted(r["job"] for r in rows) == ids
    for job in ids:     # at its declared layout: every rank and engine started
        shown = json.loads(user.weave("show", "job", str(job), "--json"))
        layout = shown["layout"]
        assert layout["words"] == "train 1x8 ranks; rollout 1x8 engines x 1 GPU", layout
        assert layout["runs"] is None, layout
