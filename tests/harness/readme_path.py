"""README's path on the session's separate-hosts cluster, run once per session and
shared (``readme_run`` in tests/daemon/conftest.py): the README-path test
(tests/daemon/test_readme_path.py) and the acceptance of the shipped examples across
hosts (tests/daemon/test_hosts_acceptance.py) assert on one run of the three shipped
examples (each takes minutes of CPU at its declared layout of 8 ranks and 8 engines).

Typed as a user types it: the exports come from ``weave cluster env`` (what ``weave
cluster up`` prints), weaved runs ``weave daemon --backend slurm --site
configs/site.example.toml`` as shipped, and the examples are submitted with
``weave-sbatch`` as they are. weaved is killed with SIGKILL once every job has made
progress, started again with the same command, and every job completes. What the tests
look at afterwards (each job's ``weave show job --json``, weaved's groups, what each node
host keeps, the node addresses) is read before weaved is stopped, and kept in a
:class:`ReadmeRun`, with the digest of each example's weights run alone (its solo
gang, run meanwhile: its CPU fills the run's waits on a 2-core machine).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.harness.hosts import node_names, node_shm, on_host
from tests.harness.solo_gang import run_solo_gang
from tests.harness.waits import settle
from tests.harness.weaved import call, release_all
from tests.slurm.session_cluster import REPO, SessionCluster
from weave_slurm.config.job import parse_job
from weave_slurm.config.site import load_site
from weave_slurm.daemon.membership import instance_tag, name_prefix
from weave_slurm.daemon.protocol import Op
from weave_slurm.model.layout import member_layout
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend

EXAMPLES = ("qwen3b-grpo-4k", "qwen7b-grpo-4k", "qwen7b-grpo-8k")
EXAMPLE_SITE = REPO / "configs" / "site.example.toml"
BIN = Path(sys.executable).parent     # the venv a user activates (`. .venv/bin/activate`)
Rows = list[dict[str, Any]]


def shell_env(home: Path) -> dict[str, str]:
    """A fresh login shell with the venv active: no variable of the test's own."""
    return {"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 120) -> str:
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    assert res.returncode == 0, f"{' '.join(argv)}: exit {res.returncode}: {res.stderr}"
    return res.stdout


def exports(text: str) -> dict[str, str]:
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

    @property
    def state(self) -> Path:
        """weaved's state directory (its default, under the working directory)."""
        return self.cwd / ".state" / "weaved"

    def weave(self, *args: str) -> str:
        return run(["weave", *args], self.cwd, self.env)

    def start_weaved(self) -> None:
        sock = self.state / "weaved.sock"
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

    def jobs(self) -> Rows:
        rows: Any = json.loads(self.weave("status", "-a", "--json"))
        return rows if isinstance(rows, list) else list(rows.get("jobs", []))

    def wait(self, done: Callable[[Rows], bool], what: str, timeout_s: float) -> Rows:
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

    def stop(self) -> None:
        """Cancel what has not ended, stop weaved, give its allocations back."""
        if self.daemon is not None and self.daemon.poll() is None:
            ids = [str(r["job"]) for r in self.jobs() if r["state"] not in
                   ("COMPLETED", "FAILED", "CANCELLED")]
            if ids:
                subprocess.run(["weave", "cancel", *ids], cwd=self.cwd, env=self.env,
                               timeout=60)
                time.sleep(5)
            os.killpg(self.daemon.pid, signal.SIGTERM)
            self.daemon.wait(timeout=60)
        # weaved without --instance: its allocations are tagged 'default'
        release_all(SlurmCliBackend(env=self.env), name_prefix(""), instance_tag(""))


@dataclass(frozen=True)
class ReadmeRun:
    """What one run of README's path left to look at."""

    exported: frozenset[str]          # the variables ``weave cluster env`` exported
    submitted: tuple[str, ...]        # weave-sbatch's output, per example
    ids: tuple[int, ...]              # the job ids, in submission order
    final: Rows                       # ``weave status -a --json`` once all completed
    shown: dict[int, dict[str, Any]]  # ``weave show job N --json``, after the restart
    groups: Rows                      # weaved's groups (GROUPS) once its jobs ended
    left: dict[str, str]              # per node host: the job files it keeps
    addresses: dict[str, str]         # each node's address as Slurm gives it to weaved
    state: Path                       # weaved's state directory
    solo: dict[str, str] = field(default_factory=dict)   # example -> its solo digest


def readme_path(sc: SessionCluster, home: Path) -> ReadmeRun:
    """Run README's path once (see the module doc) in a fresh shell at ``home`` (on the
    file system the node hosts share, as a clone in a home on NFS: weaved's default
    checkpoint root is under its state directory, in the working directory); the solo
    gang of each distinct example runs meanwhile (:func:`solo_digests`)."""
    env = shell_env(home)
    env.update(exports(run(["weave", "cluster", "env", "--state-dir",
                            str(sc.cluster.paths.state_dir)], home, env)))
    work = home / "work"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    user = User(work, env)
    with ThreadPoolExecutor(1, thread_name_prefix="solo") as pool:
        solo = pool.submit(solo_digests)   # its CPU fills the run's waits
        try:
            done = _run(user, frozenset(set(env) - set(shell_env(Path("/")))), sc)
        finally:
            user.stop()
        return replace(done, solo=solo.result(timeout=900))


def solo_member(text: str) -> MemberSpec:
    """A shipped example's solo run: the same entry, seed, options and layout (8 ranks,
    8 engines) on the site README's weaved runs with."""
    spec = parse_job(text, "spec")
    assert spec.entry is not None, spec
    return MemberSpec("solo", entry_point=spec.entry, seed=spec.seed, steps=spec.iterations,
                      options=dict(spec.options),
                      layout=member_layout(spec, load_site(EXAMPLE_SITE)))


def solo_digests() -> dict[str, str]:
    """Per shipped example, the SHA-256 of its final weights run alone (its training
    gang, :func:`~tests.harness.solo_gang.run_solo_gang`); one run per distinct member
    (the job id is not an input of a job's computation, and the examples differ only
    in what placement plans with)."""
    runs: dict[str, str] = {}
    out = {}
    for name in EXAMPLES:
        member = solo_member((REPO / "configs" / "jobs" / f"{name}.toml").read_text())
        if repr(member) not in runs:
            runs[repr(member)] = weights_digest(run_solo_gang(member).weights)
        out[name] = runs[repr(member)]
    return out


def _run(user: User, exported: frozenset[str], sc: SessionCluster) -> ReadmeRun:
    user.start_weaved()
    submitted = tuple(run(["weave-sbatch", f"configs/jobs/{name}.toml"], user.cwd,
                          user.env) for name in EXAMPLES)
    ids = tuple(int(out.split()[-1]) for out in submitted)
    user.wait(lambda rows: all(r["state"] == "COMPLETED" or (r.get("iter") or "0/").split(
        "/")[0] not in ("", "0") for r in rows) and len(rows) == 3,
        "every job's first training step", 900)
    assert user.daemon is not None
    user.daemon.send_signal(signal.SIGKILL)
    user.daemon.wait(timeout=30)
    user.start_weaved()
    final = user.wait(lambda rows: all(r["state"] == "COMPLETED" for r in rows),
                      "every job completed after the kill -9", 900)
    shown = {job: json.loads(user.weave("show", "job", str(job), "--json")) for job in ids}
    groups, left = _after_the_end(user, sc)
    addresses = {n.name: n.address or n.name for n in SlurmCliBackend(env=user.env).nodes()}
    return ReadmeRun(exported, submitted, ids, final, shown, groups, left, addresses,
                     user.state)


def _after_the_end(user: User, sc: SessionCluster,
                   timeout_s: float = 60) -> tuple[Rows, dict[str, str]]:
    """weaved's groups and the job files each node host keeps, once its groups have
    drained and no host keeps one (or ``timeout_s`` passed: then as they are)."""
    def seen() -> tuple[Rows, dict[str, str]]:
        groups: Rows = call(user.state / "weaved.sock", Op.GROUPS)["groups"]
        # (true: a node daemon whose allocation ended removes its root, which find misses)
        return groups, {node: on_host(sc.cluster, node, [
            "sh", "-c", f"find {node_shm('', node)} -mindepth 3 -type f 2>/dev/null; true"
        ]).strip() for node in node_names(sc.cluster)}

    def drained(now: tuple[Rows, dict[str, str]]) -> bool:
        return all(g["state"] in ("RELEASED", "DRAINING") for g in now[0]) \
            and not any(now[1].values())

    return settle(seen, timeout_s, interval_s=2, until=drained)
