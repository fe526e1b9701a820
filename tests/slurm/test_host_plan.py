"""Separate hosts, the pure parts: addresses, names, argv, setup script, config files.

None of this needs root: the live cluster of separate hosts is in test_cluster_hosts.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from weave_slurm.cli.cluster import cluster_app
from weave_slurm.errors import ConfigError, ExternalCommandError, StateError
from weave_slurm.slurm import hosts
from weave_slurm.slurm.cluster_config import (
    ClusterLayout,
    ClusterPaths,
    ClusterPorts,
    HostMode,
    render_gres_conf,
    render_slurm_conf,
)
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner
from weave_slurm.slurm.host_plan import (
    HostPlan,
    create_steps,
    host_argv,
    host_tag,
    plan_hosts,
    render_hosts_file,
    render_setup_script,
    setup_argv,
    tbf_argv,
)
from weave_slurm.slurm.local_cluster import LocalCluster

STATE = Path("/s")
PATHS = ClusterPaths(STATE)
LAYOUT = ClusterLayout()
PLAN = plan_hosts(STATE, LAYOUT, "10.214.3.0/24", "login")


def test_addresses_names_and_bridges() -> None:
    assert PLAN.login_addr == "10.214.3.1"
    assert [(n.name, n.addr) for n in PLAN.nodes] == [
        ("h20-0", "10.214.3.11"), ("h20-1", "10.214.3.12"),
        ("h800-0", "10.214.3.13"), ("h800-1", "10.214.3.14")]
    tag = host_tag(STATE)
    assert tag.startswith("wv") and len(tag) == 8 and tag != host_tag(Path("/other"))
    h20, h800 = PLAN.pools
    assert h20.link is None, "the hub pool has no link of its own"
    assert h800.link == (f"{tag}l1", f"{tag}p1")
    assert PLAN.hub == h20.bridge
    assert {n.bridge for n in PLAN.nodes if n.pool == "h800"} == {h800.bridge}
    assert PLAN.links() == h800.link
    assert all(len(i) <= 15 for i in PLAN.interfaces())
    assert len(set(PLAN.interfaces())) == 2 + 2 + 4
    node = PLAN.node("h800-1")
    assert node.netns == f"{tag}-h800-1" and node.mnt_file == Path(f"/run/weave-hosts/{tag}"
                                                                    "/h800-1.mnt")
    with pytest.raises(ConfigError, match=r"'h9' is not a host.*h20-0, h20-1"):
        PLAN.node("h9")


@pytest.mark.parametrize(("subnet", "match"), [
    ("10.214.3.0/33", "not a network"), ("10.214.3.1/24", "not a network"),
    ("8.8.8.0/24", "private IPv4"), ("fd00::/64", "private IPv4"),
    ("10.214.3.0/28", "no room for 4 nodes"),
])
def test_bad_subnets(subnet: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_hosts(STATE, LAYOUT, subnet, "login")
    plan_hosts(STATE, LAYOUT, "10.214.3.0/27", "login")  # 31 hosts: room for 4 from .11


def test_plan_round_trips_through_json() -> None:
    assert HostPlan.from_json(PLAN.to_json()) == PLAN
    with pytest.raises(StateError, match="unreadable host plan"):
        HostPlan.from_json({"tag": "wv1"})


def test_host_argv_and_setup_argv() -> None:
    node = PLAN.node("h20-1")
    ns = f"/run/weave-hosts/{PLAN.tag}"
    assert host_argv(node, ["hostname"]) == [
        "nsenter", f"--net=/run/netns/{PLAN.tag}-h20-1", f"--mount={ns}/h20-1.mnt",
        f"--uts={ns}/h20-1.uts", "--", "hostname"]
    assert host_argv(node, ["ls"], cwd=Path("/w"))[-3:] == ["--wd=/w", "--", "ls"]
    argv = setup_argv(node, Path("/s/run/setup-h20-1.sh"))
    assert argv[:3] == ["nsenter", f"--net=/run/netns/{PLAN.tag}-h20-1", "unshare"]
    assert argv[-5:] == ["--propagation", "private", "bash", "-e", "/s/run/setup-h20-1.sh"]


def test_create_steps_build_bridges_then_links_then_hosts() -> None:
    steps = create_steps(PLAN)
    argvs = [" ".join(s.argv) for s in steps]
    t = PLAN.tag
    assert argvs[0] == f"ip link add {t}b0 type bridge"
    assert f"ip addr add 10.214.3.1/24 dev {t}b0" in argvs
    assert f"ip link set {t}l1 master {t}b0 up" in argvs
    assert f"ip link set {t}p1 master {t}b1 up" in argvs
    assert f"ip link add {t}n3 type veth peer name eth0 netns {t}-h800-1" in argvs
    assert f"ip link set {t}n3 master {t}b1 up" in argvs
    assert f"ip -n {t}-h800-1 addr add 10.214.3.14/24 dev eth0" in argvs
    assert f"ip -n {t}-h800-1 link set lo up" in argvs
    assert argvs.index(f"ip netns add {t}-h20-0") > argvs.index(f"ip link add {t}l1 type veth "
                                                                 f"peer name {t}p1")
    assert all(s.argv[0] == "ip" for s in steps), "nothing but ip: no sysctl, no NAT"
    assert not any("route" in a or "forward" in a for a in argvs)


def test_tbf_argv() -> None:
    assert tbf_argv("x", 0.2) == ["tc", "qdisc", "replace", "dev", "x", "root", "tbf", "rate",
                                  "200mbit", "burst", "512kbit", "latency", "20ms"]
    assert tbf_argv("x", 20.0)[8:10] == ["20000mbit", "burst"]
    assert tbf_argv("x", 20.0)[10] == "20000kbit", "about 1 ms at the rate above 0.5 Gbit/s"
    with pytest.raises(ConfigError, match="must be > 0"):
        tbf_argv("x", 0)


def test_setup_script_masks_the_login_side(tmp_path: Path) -> None:
    node = PLAN.node("h800-0")
    script = render_setup_script(node, PATHS, Path("/run/weave-munge/abc"))
    lines = script.splitlines()
    assert lines[0].startswith("exec 3< /s/shared 4< /s/hosts/h800-0 5< /s/site")
    assert "hostname h800-0" in lines
    mask = lines.index("mount -t tmpfs -o mode=0755 weave-login-side /s")
    for private in ("/run", "/tmp", "/dev/shm"):
        assert any(line.startswith("mount -t tmpfs") and line.endswith(f" {private}")
                   for line in lines[:mask]), private
    after = "\n".join(lines[mask:])
    assert "mount --no-canonicalize --bind /proc/self/fd/3 /s/shared" in after
    assert "mount --no-canonicalize --bind /proc/self/fd/4 /s/hosts/h800-0" in after
    assert "mount -o remount,bind,ro /s/slurm.conf" in after
    assert "mount --bind /s/site/hosts /etc/hosts" in after
    assert "/s/login" not in script and "/s/ctld" not in script and "h800-1" not in script
    assert "install -o munge -g munge -m 0400 /etc/munge/munge.key " \
           "/run/weave-munge/abc/munge.key" in script
    path = tmp_path / "setup.sh"
    path.write_text(script)
    subprocess.run(["sh", "-n", str(path)], check=True)  # it parses


def test_hosts_file() -> None:
    text = render_hosts_file(PLAN)
    assert "10.214.3.1\tlogin" in text and "10.214.3.14\th800-1" in text
    assert "127.0.0.1\tlocalhost" in text


def test_slurm_conf_and_gres_for_separate_hosts() -> None:
    ports = ClusterPorts(7000, tuple((n, 6818) for n in LAYOUT.node_names()))
    conf = render_slurm_conf(LAYOUT, PATHS, ports, None, PLAN.addressing())
    kv = dict(line.split("=", 1) for line in conf.splitlines()
              if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert kv["SlurmctldHost"] == "login(10.214.3.1)"
    assert kv["SlurmdPort"] == "6818" and kv["TmpFS"] == "/tmp"
    assert kv["SlurmdSpoolDir"] == "/s/hosts/%n/spool"
    assert kv["SlurmdLogFile"] == "/s/hosts/%n/slurmd.log"
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert nodes[2] == ("NodeName=h800-0 NodeHostname=h800-0 NodeAddr=10.214.3.13 CPUs=32 "
                        "RealMemory=4096 Gres=gpu:h800:8 State=UNKNOWN")
    assert not any("Port=" in line for line in nodes)
    gres = render_gres_conf(LAYOUT, PATHS, HostMode.SEPARATE)
    assert "NodeName=h800-1 Name=gpu Type=h800 File=/s/hosts/h800-1/dev/nvidia[0-7]" in gres


def test_host_mode_parse() -> None:
    assert HostMode.parse("separate") is HostMode.SEPARATE
    with pytest.raises(ConfigError, match="'remote' is not a host mode; choose from shared, "
                                          "separate"):
        HostMode.parse("remote")


def _fake(routes: str = "", links: str = "") -> FakeRunner:
    fake = FakeRunner()
    fake.on(["ip", "-o", "link", "show"], FakeReply(stdout=links))
    fake.on(["ip", "netns", "list"], FakeReply(stdout=""))
    fake.on(["ip", "-o", "-4", "route", "show"], FakeReply(stdout=routes))
    return fake


def test_check_free_refuses_routes_and_interfaces_not_ours() -> None:
    hosts.check_free(PLAN, _fake("default via 192.0.2.1 dev eth0\n"
                                 "192.0.2.0/24 dev eth0 proto kernel scope link\n"))
    with pytest.raises(ConfigError, match=r"10\.214\.3\.0/24 overlaps the route '10\.214"):
        hosts.check_free(PLAN, _fake("10.214.0.0/16 dev br9 scope link\n"))
    with pytest.raises(ConfigError, match=r"overlaps the route 'unreachable 10\.0\.0\.0/8'"):
        hosts.check_free(PLAN, _fake("unreachable 10.0.0.0/8\n"))
    link = f"7: {PLAN.tag}b1: <BROADCAST> mtu 1500\n"
    with pytest.raises(StateError, match=f"interface '{PLAN.tag}b1' exists"):
        hosts.check_free(PLAN, _fake(links=link))


def test_shape_both_ends_and_unshape_only_what_is_shaped() -> None:
    fake = FakeRunner()
    fake.on(["tc", "qdisc", "replace"], FakeReply())
    hosts.shape(PLAN, 1.5, fake)
    assert [c[4] for c in fake.argvs()] == list(PLAN.links())
    fake = FakeRunner()
    hub_end, pool_end = PLAN.links()
    fake.on(["tc", "qdisc", "show", "dev", hub_end], FakeReply(
        stdout="qdisc tbf 8005: root refcnt 3 rate 200Mbit burst 64Kb lat 20ms\n"))
    fake.on(["tc", "qdisc", "show", "dev", pool_end], FakeReply(stdout="qdisc noqueue 0:\n"))
    fake.on(["tc", "qdisc", "del"], FakeReply())
    hosts.shape(PLAN, None, fake)
    assert [c for c in fake.argvs() if "del" in c] == [("tc", "qdisc", "del", "dev", hub_end,
                                                        "root")]


def test_a_failed_step_names_itself_with_the_evidence() -> None:
    fake = FakeRunner()
    fake.on(["tc"], FakeReply(returncode=2, stderr="Error: Specified qdisc kind is unknown."))
    with pytest.raises(ExternalCommandError) as info:
        hosts.shape(PLAN, 1.0, fake)
    msg = str(info.value)
    assert msg.startswith(f"separate hosts: shape {PLAN.links()[0]} to 1 Gbit/s: tc qdisc")
    assert "(exit 2): Error: Specified qdisc kind is unknown." in msg and "\n" not in msg


def test_up_refuses_network_flags_in_shared_mode_and_helpers_need_hosts(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c")
    with pytest.raises(ConfigError, match="only with --hosts separate"):
        cluster.up(hosts=HostMode.SHARED, interpool_gbps=1.0)
    with pytest.raises(StateError, match="has no separate hosts"):
        cluster.host_argv("h20-0", ["true"])
    assert cluster.hosts_plan() is None
    assert cluster.shared_paths().ckpt == (tmp_path / "c" / "shared" / "ckpt").resolve()


def test_cli_exec_and_shape_errors_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cluster_app, ["exec", "--state-dir", str(tmp_path), "h20-0", "--",
                                      "true"])
    assert res.exit_code == 1 and "has no separate hosts" in res.output
    res = runner.invoke(cluster_app, ["shape", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2 and "give --interpool-gbps RATE or --off" in res.output
    res = runner.invoke(cluster_app, ["up", "--state-dir", str(tmp_path), "--hosts", "remote"])
    assert res.exit_code == 2


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_hosts_file_and_script_quote_odd_paths(tmp_path: Path) -> None:
    odd = ClusterPaths(Path("/s p/it's"))
    plan = plan_hosts(odd.state_dir, LAYOUT, "10.214.3.0/24", "login")
    script = render_setup_script(plan.node("h20-0"), odd, Path("/run/m"))
    path = tmp_path / "setup.sh"
    path.write_text(script)
    subprocess.run(["sh", "-n", str(path)], check=True)
    assert "'/s p/it'\"'\"'s/shared'" in script
