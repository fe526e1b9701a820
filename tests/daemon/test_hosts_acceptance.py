"""weave-slurm on a cluster of separate hosts, as on a site (the session's cluster).

2 h20 and 2 h800 nodes, each a host of its own (own network, /dev/shm, /tmp, /run;
only the cluster's shared file systems in common); weaved runs on the login side
with its state in a directory no node sees and its checkpoints on the shared root.
Three jobs from configs/jobs/ complete, each with the weights of its solo run: every
control message crossed a host boundary over TCP (munge-authenticated) and every
segment (weights, trajectories) was moved by the sync agents, steps on the nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.solo import run_solo
from tests.harness.solo_gang import run_solo_gang
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.job import parse_job
from weave_slurm.config.site import default_site
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.model.layout import member_layout
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOBS = ("qwen3b-grpo-4k", "qwen7b-grpo-4k", "qwen7b-grpo-8k")
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


def _spec(name: str, seed: int) -> str:
    """The shipped example as it is (its iterations, entry and options), with a seed."""
    text = (REPO / "configs" / "jobs" / f"{name}.toml").read_text()
    return f"seed = {seed}\n" + text


def _member(text: str, job_id: int) -> MemberSpec:
    """Its solo run: the same entry, seed, options and layout (8 ranks, 8 engines)."""
    spec = parse_job(text, "spec")
    assert spec.entry is not None and spec.iterations == ITERATIONS
    return MemberSpec(str(job_id), entry_point=spec.entry, seed=spec.seed,
                      steps=spec.iterations, options=dict(spec.options),
                      layout=member_layout(spec, default_site()))


def test_three_jobs_complete_across_hosts_with_their_solo_weights(site: Site) -> None:
    instance = f"ha{os.getpid()}"
    cfg = DaemonConfig(state_dir=site.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime="rl", client_timeout_s=10.0, env=site.env,
                       checkpoint_root=site.ckpt)
    backend = SlurmCliBackend(env=site.env)
    with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
        texts = {}
        for i, name in enumerate(JOBS):
            text = _spec(name, 71 + i)
            job = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
            texts[job] = text
        rows = wait_states(cfg.socket, list(texts), {"COMPLETED", "FAILED"}, 600, [])
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
        for job, text in texts.items():
            live = w.driver.live(job)
            assert live is not None, job
            solo = run_solo_gang(_member(text, job))
            assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job}"
        plan = site.cluster.hosts_plan()
        assert plan is not None   # weaved reached each node at its own host's address
        assert {n.name: w.nodes.address(n.name) for n in plan.nodes} == \
            {n.name: n.addr for n in plan.nodes}
        assert not any(a.startswith("127.") for a in (n.addr for n in plan.nodes))
        _nothing_left(site, w, instance)


def _nothing_left(site: Site, w: Weaved, instance: str) -> None:
    """No node keeps a file of any job of this instance (a node root keeps only its
    registry and locks), and no node sees weaved's state directory."""
    plan = site.cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(site.cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; "
                      f"test -e {site.state} && echo VISIBLE || true"])
        assert out.strip() == "", f"{node}: {out}"
    groups: list[dict[str, Any]] = call(site.state / "weaved.sock", Op.GROUPS)["groups"]
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
    hosts = {str(s["module"]) for s in seen(work)}
    assert hosts == {str(src / "my_pkg" / "job.py")}, hosts   # imported from the shared dir
    assert {str(s["cwd"]) for s in seen(work)} == {str(work)}
    plan = site.cluster.hosts_plan()
    assert plan is not None               # on the node hosts (each names itself), not here
    assert {str(s["host"]) for s in seen(work)} <= {n.name for n in plan.nodes}, seen(work)
