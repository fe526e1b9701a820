"""The local cluster's config files (pure rendering) and the --nodes layout syntax."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.config.oci import parse_oci_conf
from weave_slurm.errors import ConfigError
from weave_slurm.slurm.cluster_config import (
    ClusterLayout,
    ClusterPaths,
    ClusterPorts,
    HostAddressing,
    HostMode,
    PoolShape,
    parse_layout,
    render_gres_conf,
    render_oci_conf,
    render_plugstack_conf,
    render_slurm_conf,
)

PATHS = ClusterPaths(Path("/s"))
LAYOUT = ClusterLayout()
PORTS = ClusterPorts(7000, tuple((n, 7001 + i) for i, n in enumerate(LAYOUT.node_names())))


def _kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines()
                if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))


def test_slurm_conf_has_the_verified_settings() -> None:
    conf = render_slurm_conf(LAYOUT, PATHS, PORTS, Path("/s/munge/munge.socket.2"))
    kv = _kv(conf)
    assert kv["SlurmctldPort"] == "7000"
    assert kv["AuthInfo"] == "socket=/s/munge/munge.socket.2"
    assert kv["SlurmdSpoolDir"] == "/s/spool/%n" and kv["TmpFS"] == "/s/tmp/%n"
    for key, value in [("ProctrackType", "proctrack/linuxproc"), ("TaskPlugin", "task/none"),
                       ("SelectType", "select/cons_tres"), ("SelectTypeParameters", "CR_Core"),
                       ("SchedulerParameters", "bf_interval=1"),
                       ("SlurmdParameters", "config_overrides"), ("GresTypes", "gpu"),
                       ("PlugStackConfig", "/s/plugstack.conf")]:
        assert kv[key] == value, key
    assert "AccountingStorageTRES" not in kv, "fatal without slurmdbd"
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert nodes[0] == ("NodeName=h20-0 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7001 "
                        "CPUs=32 RealMemory=4096 Gres=gpu:h20:8 State=UNKNOWN")
    assert len({line.split("Port=")[1].split()[0] for line in nodes}) == 4
    assert "PartitionName=h800 Nodes=h800-0,h800-1 Default=NO" in conf
    assert "AuthInfo" not in render_slurm_conf(LAYOUT, PATHS, PORTS, None)


def test_gres_and_plugstack() -> None:
    gres = render_gres_conf(LAYOUT, PATHS)
    assert "AutoDetect=off" in gres
    assert "NodeName=h800-1 Name=gpu Type=h800 File=/s/dev/h800-1/nvidia[0-7]" in gres
    one = ClusterLayout((PoolShape("h20", "h20", 1, gpus_per_node=1),))
    assert "File=/s/dev/h20-0/nvidia0" in render_gres_conf(one, PATHS)
    assert render_plugstack_conf(Path("/p/weave.so"), Path("/run/w")).splitlines()[-1] == \
        "optional /p/weave.so sockdir=/run/w"
    assert "optional" not in render_plugstack_conf(None, None)


def test_parse_layout() -> None:
    layout = parse_layout("h20=3, h800=2")
    assert layout.node_names() == ("h20-0", "h20-1", "h20-2", "h800-0", "h800-1")
    assert layout.pools[1].gpu_type == "h800"


@pytest.mark.parametrize(("spec", "match"), [
    ("h20", "PARTITION=COUNT"), ("h20=x", "bad item"), ("", "names no pool"),
    ("h20=0", "node_count=0"), ("h20=1,h20=2", "given twice"),
])
def test_parse_layout_errors(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_layout(spec)


def test_oci_conf_names_the_runtime_for_srun_container(tmp_path: Path) -> None:
    conf = parse_oci_conf(render_oci_conf("/usr/sbin/runc"), tmp_path / "oci.conf")
    assert conf.problem() is None
    assert conf.run == "/usr/sbin/runc --root=/run/weave-oci run --bundle %b %n.%u.%j.%s.%t"
    # Slurm 22.05 refuses RunTimeRun unless query, kill and delete are set too
    assert {"runtimequery", "runtimekill", "runtimedelete"} <= set(conf.values)
    none = parse_oci_conf(render_oci_conf(None), tmp_path / "oci.conf")
    assert "configures no OCI runtime" in str(none.problem())
    assert ClusterPaths(tmp_path).oci_conf in ClusterPaths(tmp_path).conf_files


def test_a_long_state_dir_puts_the_spool_where_slurmstepd_sockets_fit() -> None:
    """A batch step's slurmstepd socket is <spool>/<node>_<job>.4294967291: under a long
    state dir (pytest's tmp paths) it passes the 107 bytes of a Unix socket path and
    Slurm cannot start any batch job on that node ("Unix socket name exceeded maximum
    length"; the allocation script is one). The spool then goes to a short dir in /run."""
    long = ClusterPaths(Path("/tmp/pytest-of-root/pytest-329/test_the_group_a_move_waits_to0"
                             "/cluster"))
    assert long.spool_in_run and not PATHS.spool_in_run
    separate = HostAddressing("login", "10.0.0.1", tuple(
        (n, f"10.0.0.{i + 2}") for i, n in enumerate(LAYOUT.node_names())))
    for hosts in (None, separate):
        spool = _kv(render_slurm_conf(LAYOUT, long, PORTS, Path("/m"), hosts))["SlurmdSpoolDir"]
        assert spool == f"{long.run_spool_root}/%n"
        assert len(f"{spool.replace('%n', 'h800-0')}/h800-0_4294967295.4294967291") <= 107
    assert long.node_spool_dir("h800-0", HostMode.SEPARATE) == long.run_spool_root / "h800-0"
