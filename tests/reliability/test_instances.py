"""weaved touches only its own Slurm jobs, on the session's Slurm cluster of separate hosts
(issue 14.5).

Ownership is the uid AND the instance tag in the allocation's comment
(``weave:<instance>:<group>:<pool>``), never the name prefix:

* an ordinary user (``nobody``, through ``runuser``) submits ``sbatch -J
  weave-g999-h20-0``, a name under the prefix of a weaved without ``--instance``; root's
  weaved (no instance) runs a job of its own to the end; the user's job still runs;
* two weaved on one Slurm, one without ``--instance`` (whose name prefix ``weave-g`` is
  a prefix of every instance's names) and one with, each with its own state dir, each
  complete a job; neither releases the other's allocations.

Jobs run the idle driver with short steps (no torch): these are tests of the reconcile
loop against Slurm's own answers (``squeue --json`` lists every user's jobs whatever
``--user`` says, in 22.05).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.waits import wait_for
from tests.harness.weaved import call, pings
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.driver import IdleDriver
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.slurm.backend import DEFAULT_INSTANCE, StepHandle
from weave_slurm.slurm.cluster_config import HostMode
from weave_slurm.slurm.command_runner import run_command

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "REFUSED"}


@dataclass
class Served:
    weaved: Weaved
    thread: threading.Thread
    tag: str

    @property
    def socket(self) -> Path:
        return self.weaved.config.socket

    def allocations(self) -> set[str]:
        """Slurm's live jobs whose comment carries this weaved's tag (asked of squeue
        itself, not through the backend under test)."""
        out = run_command(["squeue", "-h", "-t", "PD,R", "-o", "%i|%k"],
                          env=self.weaved.config.env, timeout_s=20).stdout
        return {i for i, _, comment in (line.partition("|") for line in out.splitlines())
                if comment.startswith(f"weave:{self.tag}:")}


@contextlib.contextmanager
def weaved(public: Path, env: dict[str, str], instance: str,
           step: float | Path) -> Iterator[Served]:
    """An in-process weaved on Slurm whose jobs' steps exit 0 after ``step``: seconds,
    or once that file exists (a gate the test opens: no race with how long Slurm takes);
    at the end it is stopped and whatever it still holds is released."""
    state = public / f"state-{instance or DEFAULT_INSTANCE}"
    cfg = DaemonConfig(state_dir=state, backend="slurm", instance=instance, tick_s=0.3,
                       node_command=("sleep", "infinity"), client_timeout_s=5.0, env=env)
    argv = (("sleep", f"{step:g}") if not isinstance(step, Path) else
            ("sh", "-c", f"until [ -e '{step}' ]; do sleep 0.2; done"))
    w = Weaved(cfg, driver=IdleDriver(argv))
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    served = Served(w, thread, instance or DEFAULT_INSTANCE)
    try:
        wait_for(lambda: pings(cfg.socket), 30, f"weaved {instance!r} answers")
        yield served
    finally:
        w.stop()
        thread.join(timeout=30)
        backend = w.backend
        for a in backend.list_allocations(instance=served.tag):
            for s in backend.list_steps(a.alloc_id):
                backend.cancel_step(StepHandle(a.alloc_id, s.name, 0))
            backend.release(a.alloc_id)


def submit(w: Served, name: str) -> int:
    return int(call(w.socket, Op.SUBMIT, spec=job_spec_toml(name), source=f"{name}.toml")["job"])


def job_row(w: Served, job: int) -> dict[str, Any]:
    return dict(call(w.socket, Op.STATUS, jobs=[job])["jobs"][0])


def until_ended(w: Served, job: int, timeout_s: float = 60) -> dict[str, Any]:
    return wait_for(lambda: job_row(w, job), timeout_s, f"job {job} to end", interval_s=0.3,
                    until=lambda r: r["state"] in ENDED)


def slurm_state(env: dict[str, str], job_id: str) -> str:
    return run_command(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, timeout_s=20,
                       check=False).stdout.strip()


@contextlib.contextmanager
def open_to_all(paths: list[Path]) -> Iterator[None]:
    """Let any uid reach the cluster's client files (read) and its nodes' spool dirs
    (where slurmd keeps a batch script the job's user executes) for a moment: the state
    dir lies under pytest's 0700 base dir. o+x on every dir on the way, o+r on files;
    the old modes come back after."""
    changed: dict[Path, int] = {}
    for path in paths:
        for d in [*reversed(path.parents), path]:
            mode = changed.get(d, stat.S_IMODE(d.stat().st_mode))
            want = mode | stat.S_IXOTH | (stat.S_IROTH if d.is_file() else 0)
            if want != mode:
                os.chmod(d, want)
                changed.setdefault(d, mode)
    try:
        yield
    finally:
        for d, mode in changed.items():
            os.chmod(d, mode)


def _opened_paths(slurm_cluster: SessionCluster) -> list[Path]:
    """What ``sbatch`` (on the login side) and a batch job of another uid (on a node's
    host: its spool dir, bound from the login's, holds the script) need to reach."""
    paths = slurm_cluster.cluster.paths
    spool = [paths.node_spool_dir(n, HostMode.SEPARATE) for n in slurm_cluster.nodes]
    sock = slurm_cluster.env.get("MUNGE_SOCKET")
    return [paths.slurm_conf, paths.plugstack_conf, slurm_cluster.spank_plugin, *spool,
            *([Path(sock).parent] if sock else [])]


def test_an_ordinary_users_job_named_like_ours_survives_a_weaved_tick_cycle(
        slurm_cluster: SessionCluster, public_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = dict(slurm_cluster.env)
    foreign = ""
    try:
        with open_to_all(_opened_paths(slurm_cluster)):
            out = run_command(["runuser", "-u", "nobody", "--", "sbatch", "--parsable",
                               "-J", "weave-g999-h20-0", "-p", "h20", "-c", "1",
                               "--chdir=/tmp", "--output=/dev/null", "--wrap", "sleep 300"],
                              env=env, timeout_s=30)
            foreign = out.stdout.strip().split(";")[0]
            wait_for(lambda: slurm_state(env, foreign), 30, f"job {foreign} running",
                     until=lambda s: s == "RUNNING")
            time.sleep(0.5)   # its script is exec'd (a failed exec ends it at once)
        assert slurm_state(env, foreign) == "RUNNING"
        caplog.set_level(logging.INFO, logger="weave_slurm.daemon.reconcile")
        with weaved(public_dir, env, "", 2) as w:   # no --instance: prefix weave-g
            assert w.weaved.reconciler.prefix == "weave-g"
            job = submit(w, "own")
            assert until_ended(w, job)["state"] == "COMPLETED"
            wait_for(lambda: not w.allocations(), 30, "its allocations released")
            rec = w.weaved.reconciler
            after = rec.ticks
            wait_for(lambda: rec.ticks, 10, "three more ticks", until=lambda t: t >= after + 3)
        assert slurm_state(env, foreign) == "RUNNING", "weaved cancelled nobody's job"
        assert "orphan" not in caplog.text
    finally:
        if foreign:
            run_command(["scancel", foreign], env=env, timeout_s=20, check=False)


def test_two_instances_on_one_slurm_each_complete_a_job_and_keep_the_others(
        slurm_cluster: SessionCluster, public_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = dict(slurm_cluster.env)
    named = f"i{os.getpid()}"
    caplog.set_level(logging.INFO, logger="weave_slurm.daemon.reconcile")
    # the gates on the cluster's shared file system (a host's /tmp is its own)
    gates = slurm_cluster.cluster.paths.shared.work / f"gates-{named}"
    gates.mkdir(parents=True, exist_ok=True)
    gate_a, gate_b = gates / "a", gates / "b"
    with weaved(public_dir, env, "", gate_a) as plain, weaved(public_dir, env, named, gate_b) as b:
        ja, jb = submit(plain, "a"), submit(b, "b")
        wait_for(lambda: (job_row(plain, ja)["state"], job_row(b, jb)["state"]), 120,
                 "both jobs running", until=lambda s: s == ("RUNNING", "RUNNING"))
        held_a, held_b = plain.allocations(), b.allocations()
        assert len(held_a) == len(held_b) == 2 and not held_a & held_b
        names = dict(line.split("|") for line in run_command(
            ["squeue", "-h", "-o", "%i|%j"], env=env, timeout_s=20).stdout.splitlines())
        assert all(names[i].startswith("weave-g") for i in held_a | held_b)  # one prefix...
        gate_a.touch()
        assert until_ended(plain, ja)["state"] == "COMPLETED"
        wait_for(lambda: not plain.allocations(), 30, "the plain weaved's allocations released")
        assert b.allocations() == held_b   # ... but the plain one kept to its own
        assert job_row(b, jb)["state"] == "RUNNING"
        gate_b.touch()
        assert until_ended(b, jb)["state"] == "COMPLETED"
        wait_for(lambda: not b.allocations(), 30, "the named weaved's allocations released")
    shutil.rmtree(gates)
    assert "orphan" not in caplog.text
