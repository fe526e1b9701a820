"""The local cluster's lifecycle: ready, idempotent, stops exactly its own daemons; CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.slurm.session_cluster import SessionCluster
from weave_slurm.cli.cluster import cluster_app
from weave_slurm.slurm import daemons
from weave_slurm.slurm.cluster import LocalCluster
from weave_slurm.slurm.cluster_config import parse_layout

pytestmark = pytest.mark.slurm


def test_session_cluster_is_ready_and_up_is_idempotent(slurm_cluster: SessionCluster) -> None:
    st = slurm_cluster.status
    assert st.ready
    assert [(n.name, n.gres) for n in st.nodes] == [
        ("h20-0", "gpu:h20:8"), ("h20-1", "gpu:h20:8"),
        ("h800-0", "gpu:h800:8"), ("h800-1", "gpu:h800:8")]
    assert {d.name for d in st.daemons} >= {"slurmctld", "slurmd-h20-0", "slurmd-h800-1"}
    again = slurm_cluster.cluster.up(spank_plugin=slurm_cluster.spank_plugin,
                                     socket_dir=slurm_cluster.socket_dir)
    assert again.already_up
    assert [d.pid for d in again.daemons] == [d.pid for d in st.daemons]


def test_cli_up_status_down_on_a_second_cluster(tmp_path: Path) -> None:
    runner = CliRunner()
    state = str(tmp_path / "c2")
    try:
        _cli_round_trip(runner, state, tmp_path)
    finally:
        LocalCluster(Path(state)).down()


def _cli_round_trip(runner: CliRunner, state: str, tmp_path: Path) -> None:
    res = runner.invoke(cluster_app, ["up", "--state-dir", state, "--nodes", "h20=2,h800=1"])
    assert res.exit_code == 0, res.output
    assert f"export SLURM_CONF={tmp_path / 'c2' / 'slurm.conf'}" in res.output
    res = runner.invoke(cluster_app, ["status", "--state-dir", state, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ready"] and [n["name"] for n in data["nodes"]] == ["h20-0", "h20-1", "h800-0"]
    records = [daemons.read(p) for p in (tmp_path / "c2" / "run").glob("*.pid")]
    assert len(records) == 5  # munged, slurmctld, 3 slurmds
    res = runner.invoke(cluster_app, ["down", "--state-dir", state])
    assert res.exit_code == 0 and "slurmctld" in res.output
    assert not any(daemons.is_alive(r) for r in records if r is not None)
    res = runner.invoke(cluster_app, ["status", "--state-dir", state])
    assert res.exit_code == 1
    assert runner.invoke(cluster_app, ["down", "--state-dir", state]).output.strip() == \
        "nothing was running"


def test_a_different_layout_restarts_and_bad_flags_are_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c3")
    try:
        first = cluster.up(parse_layout("h20=1"))
        second = cluster.up(parse_layout("h20=2"))
        assert not second.already_up
        assert [n.name for n in second.nodes] == ["h20-0", "h20-1"]
        assert not any(d.pid in {x.pid for x in second.daemons} for d in first.daemons)
    finally:
        cluster.down()
    res = CliRunner().invoke(cluster_app, ["up", "--state-dir", str(tmp_path / "c4"),
                                           "--spank", str(tmp_path / "missing.so")])
    assert res.exit_code == 2
    assert "--spank: plugin" in res.output and "make -C spank" in res.output
