"""weave-slurm on a cluster of separate hosts, as on a site (the session's cluster).

2 h20 and 2 h800 nodes, each a host of its own (own network, /dev/shm, /tmp, /run;
only the cluster's shared file systems in common); weaved runs on the login side
with its state in a directory no node sees and its checkpoints on the shared root.
The three jobs of configs/jobs/ that README's path runs (the session's ``readme_run``,
shared with tests/daemon/test_readme_path.py: one run of minutes instead of two)
complete, each with the weights of its solo run: every control message crossed a host
boundary over TCP (munge-authenticated) and every segment (weights, trajectories) was
moved by the sync agents, steps on the nodes. (Distinct seeds per member across hosts:
tests/daemon/test_gang_hosts.py.) A weaved whose state lies on the login side only
(the own-module test's) leaves nothing on the hosts, and no host sees its state.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.readme_path import EXAMPLES, ReadmeRun, solo_member
from tests.harness.solo import run_solo
from tests.harness.waits import settle
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.local_cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 3


@dataclass
class Site:
    cluster: LocalCluster
    env: dict[str, str]
    state: Path        # weaved's, on the login side only
    ckpt: Path         # the shared checkpoint root
    work: Path         # a shared directory for users' files


@pytest.fixture(scope="module")
def site(slurm_cluster: SessionCluster) -> Site:
    """The session's cluster of separate hosts, with a login-side state dir and a
    checkpoint root on the shared file system for this module's weaved."""
    dirs = weaved_dirs(slurm_cluster.cluster, f"ha{os.getpid()}")
    return Site(slurm_cluster.cluster, dict(slurm_cluster.env), dirs.state, dirs.ckpt,
                slurm_cluster.shared.work)


def test_three_jobs_complete_across_hosts_with_their_solo_weights(
        site: Site, readme_run: ReadmeRun) -> None:
    """The three shipped examples of README's path (the session's ``readme_run``: weaved
    from the login side, ``weave-sbatch`` as shipped, a kill -9 of weaved mid-run), each
    with the weights of its solo gang (run meanwhile: ``readme_run.solo``)."""
    rows = readme_run.final
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    for job, name in zip(readme_run.ids, EXAMPLES, strict=True):
        shown = readme_run.shown[job]
        assert (shown["name"], tomllib.loads(shown["spec"])) == \
            (name, tomllib.loads((REPO / "configs" / "jobs" / f"{name}.toml").read_text()))
        solo = solo_member(shown["spec"])   # the same entry, seed, options and layout
        assert solo.entry_point == "builtin:grpo-toy" and solo.steps == ITERATIONS, solo
        assert solo.layout is not None and (solo.layout.train.ranks,
                                            solo.layout.rollout.engines) == (8, 8), solo
        assert shown["weights_sha256"] == readme_run.solo[name], f"job {job}"
    plan = site.cluster.hosts_plan()
    assert plan is not None   # weaved reached each node at its own host's address
    assert readme_run.addresses == {n.name: n.addr for n in plan.nodes}
    assert not any(a.startswith("127.") for a in (n.addr for n in plan.nodes))
    for node, out in readme_run.left.items():   # no node keeps a file of any job of
        assert out == "", f"{node}: {out}"      # README's weaved (a node root keeps only
    assert all(g["state"] in ("RELEASED", "DRAINING")   # its registry and locks)
               for g in readme_run.groups), readme_run.groups


def _nothing_left(site: Site, state: Path, instance: str) -> None:
    """No node keeps a file of any job of this instance (a node root keeps only its
    registry and locks), and no node sees weaved's state directory (on the login side
    only; its checkpoints on the shared root)."""
    plan = site.cluster.hosts_plan()
    assert plan is not None

    def seen() -> tuple[dict[str, str], list[dict[str, Any]]]:
        left = {n.name: on_host(site.cluster, n.name, [
            "sh", "-c", f"find /dev/shm/weave-nodes/{instance}/{n.name} -mindepth 3 "
                        f"-type f 2>/dev/null; test -e {state} && echo VISIBLE || true"]).strip()
                for n in plan.nodes}
        return left, call(state / "weaved.sock", Op.GROUPS)["groups"]

    def drained(now: tuple[dict[str, str], list[dict[str, Any]]]) -> bool:
        return not any(now[0].values()) and all(g["state"] in ("RELEASED", "DRAINING")
                                                for g in now[1])

    left, groups = settle(seen, 60, interval_s=2, until=drained)   # its job just ended
    for node, out in left.items():
        assert out == "", f"{node}: {out}"
    assert all(g["state"] in ("RELEASED", "DRAINING") for g in groups), groups


def test_a_users_own_module_on_a_shared_dir_runs_on_the_hosts(site: Site) -> None:
    """The job's package and workdir lie on the shared work file system (not on weaved's
    path, not in the repo): its workers on the node hosts import it from there."""
    import importlib.util

    from tests.harness.specs import OPTIONS
    from tests.runtime.own_code import seen, user_package
    from weave_slurm.config.render import job_spec_toml

    assert importlib.util.find_spec("my_pkg") is None
    home = site.work / f"alice-{os.getpid()}"
    home.mkdir(mode=0o755)
    src = user_package(home)
    work = home / "run"
    work.mkdir(mode=0o755)
    instance = f"hu{os.getpid()}"
    cfg = DaemonConfig(state_dir=site.state.with_name(f"weaved-{instance}"), backend="slurm",
                       instance=instance, tick_s=0.3, runtime="rl", client_timeout_s=10.0,
                       env=site.env, checkpoint_root=site.ckpt, path_roots=(site.work,))
    spec = job_spec_toml("own-hosts", entry="my_pkg.job:make", seed=81,
                         iterations=ITERATIONS, options=OPTIONS, workdir=str(work),
                         pythonpath=[str(src)])
    with serving(cfg, SlurmCliBackend(env=site.env), prefix=f"weave-g{instance}.") as w:
        job = int(call(cfg.socket, Op.SUBMIT, spec=spec, source="own.toml")["job"])
        (row,) = wait_states(cfg.socket, [job], {"COMPLETED", "FAILED"}, 300, [])
        assert row["state"] == "COMPLETED", row
        live = w.driver.live(job)
        assert live is not None
        solo = run_solo(MemberSpec(str(job), seed=81, steps=ITERATIONS, options=OPTIONS))
        assert live["weights_sha256"] == weights_digest(solo.weights)
        _nothing_left(site, cfg.state_dir, instance)
    hosts = {str(s["module"]) for s in seen(work)}
    assert hosts == {str(src / "my_pkg" / "job.py")}, hosts   # imported from the shared dir
    assert {str(s["cwd"]) for s in seen(work)} == {str(work)}
    plan = site.cluster.hosts_plan()
    assert plan is not None               # on the node hosts (each names itself), not here
    assert {str(s["host"]) for s in seen(work)} <= {n.name for n in plan.nodes}, seen(work)
