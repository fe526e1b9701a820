"""The local cluster's lifecycle: ready, idempotent, stops exactly its own daemons; CLI.

The session cluster is one of separate hosts, as every `slurm` test's. The CLI round
trip is the one test of the shared-host mode itself (``weave cluster up``'s default on a
workstation): up, status, a step and a login-side srun, down with nothing of it left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.harness.hosts import LAYOUT, bring_up
from tests.harness.processes import carrying_conf
from tests.harness.waits import wait_for
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.cli.cluster import cluster_app
from weave_slurm.slurm import daemons
from weave_slurm.slurm.cluster_config import HostMode, parse_layout
from weave_slurm.slurm.command_runner import BackgroundProcess, SubprocessRunner
from weave_slurm.slurm.local_cluster import LocalCluster

pytestmark = pytest.mark.slurm


def test_session_cluster_is_ready_and_up_is_idempotent(slurm_cluster: SessionCluster) -> None:
    st = slurm_cluster.status
    assert st.ready and st.hosts is HostMode.SEPARATE
    assert [(n.name, n.gres) for n in st.nodes] == [
        ("h20-0", "gpu:h20:8"), ("h20-1", "gpu:h20:8"),
        ("h800-0", "gpu:h800:8"), ("h800-1", "gpu:h800:8")]
    assert {d.name for d in st.daemons} >= {"slurmctld", "slurmd-h20-0", "slurmd-h800-1",
                                            "munged-h20-0"}
    plan = slurm_cluster.cluster.hosts_plan()
    assert plan is not None
    again = slurm_cluster.cluster.up(LAYOUT, hosts=HostMode.SEPARATE, subnet=plan.subnet,
                                     spank_plugin=slurm_cluster.spank_plugin,
                                     socket_dir=slurm_cluster.socket_dir)
    assert again.already_up
    assert [d.pid for d in again.daemons] == [d.pid for d in st.daemons]


def test_cli_up_status_down_on_a_second_cluster(tmp_path: Path) -> None:
    """Shared-host mode: the one test that needs it, since it tests that mode."""
    runner = CliRunner()
    state = str(tmp_path / "c2")
    try:
        _cli_round_trip(runner, state, tmp_path)
    finally:
        LocalCluster(Path(state)).down()


def _cli_round_trip(runner: CliRunner, state: str, tmp_path: Path) -> None:
    res = runner.invoke(cluster_app, ["up", "--state-dir", state, "--nodes", "h20=2,h800=1"])
    assert res.exit_code == 0, res.output
    conf = tmp_path / "c2" / "slurm.conf"
    assert f"export SLURM_CONF={conf}" in res.output
    res = runner.invoke(cluster_app, ["status", "--state-dir", state, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ready"] and data["hosts"] == "shared"
    assert [n["name"] for n in data["nodes"]] == ["h20-0", "h20-1", "h800-0"]
    records = [daemons.read(p) for p in (tmp_path / "c2" / "run").glob("*.pid")]
    assert len(records) == 5  # munged, slurmctld, 3 slurmds
    srun = _sleeping_step(LocalCluster(Path(state)), tmp_path)
    try:
        res = runner.invoke(cluster_app, ["down", "--state-dir", state])
        assert res.exit_code == 0 and "slurmctld" in res.output
        assert "other processes on this host" in res.output, res.output
        assert not any(daemons.is_alive(r) for r in records if r is not None)
        assert carrying_conf(conf) == {}, "a step, task or srun outlived down"
        assert srun.poll() is not None
    finally:
        _kill_group(srun)
    res = runner.invoke(cluster_app, ["status", "--state-dir", state])
    assert res.exit_code == 1
    assert runner.invoke(cluster_app, ["down", "--state-dir", state]).output.strip() == \
        "nothing was running"


def _sleeping_step(cluster: LocalCluster, logs: Path) -> BackgroundProcess:
    """``srun sleep 1000`` from this side (its own session), once its task runs."""
    srun = SubprocessRunner().spawn(["srun", "-p", "h20", "-n1", "sleep", "1000"],
                                    env=cluster.env, log_path=logs / "sleep.out")
    conf = cluster.paths.slurm_conf
    wait_for(lambda: carrying_conf(conf), 30, "srun, slurmstepd and the sleep task",
             until=lambda found: {"srun", "slurmstepd", "sleep"} <= set(found.values()))
    return srun


def _kill_group(proc: BackgroundProcess) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_a_different_layout_restarts_and_bad_flags_are_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c3")
    try:
        first = bring_up(cluster, parse_layout("h20=1"))
        second = bring_up(cluster, parse_layout("h20=2"))
        assert not second.already_up and second.hosts is HostMode.SEPARATE
        assert [n.name for n in second.nodes] == ["h20-0", "h20-1"]
        assert not any(d.pid in {x.pid for x in second.daemons} for d in first.daemons)
    finally:
        cluster.down()
    res = CliRunner().invoke(cluster_app, ["up", "--state-dir", str(tmp_path / "c4"),
                                           "--spank", str(tmp_path / "missing.so")])
    assert res.exit_code == 2
    assert "--spank: plugin" in res.output and "make -C spank" in res.output
