"""A live cluster of separate hosts: 2 h20 + 2 h800 nodes, each a host of its own.

One cluster for the module (about half a second to bring up). The tests check what a
site has and a one-host cluster has not: each node names itself and has its own
address, its /dev/shm and /tmp are its own, only the shared file systems are common,
the login side's files are hidden, the link between the pools is slow when shaped
while each pool stays fast, and ``down`` leaves nothing behind, steps and a login-side
srun included (the last test).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.hosts import free_subnet
from tests.harness.processes import carrying_conf
from weave_slurm.slurm import hosts
from weave_slurm.slurm.cluster_config import ClusterLayout, HostMode, PoolShape
from weave_slurm.slurm.command_runner import CommandResult, SubprocessRunner, run_command
from weave_slurm.slurm.host_plan import HostPlan
from weave_slurm.slurm.local_cluster import ClusterStatus, LocalCluster

pytestmark = [
    pytest.mark.slurm, pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="separate hosts need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("slurmd", "ip", "tc", "nsenter",
                                                             "unshare", "setpriv")),
                       reason="needs slurmd, iproute2 (ip, tc) and util-linux"),
]

LAYOUT = ClusterLayout((PoolShape("h20", "h20", 2, gpus_per_node=2, cpus_per_node=4),
                        PoolShape("h800", "h800", 2, gpus_per_node=2, cpus_per_node=4)))
NODES = LAYOUT.node_names()
PORT = 29517            # each host has its own network: no clash with anything else
MBYTES = 20
SHAPED_GBPS = 0.2

RECV = ("import socket, sys, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {PORT})); s.listen(1); s.settimeout(30)\n"
        "c, _ = s.accept(); n = 0; t0 = None\n"
        "while True:\n"
        "    b = c.recv(1 << 20)\n"
        "    if not b: break\n"
        "    t0 = t0 or time.monotonic(); n += len(b)\n"
        "print(n, time.monotonic() - t0, flush=True)\n")
SEND = ("import socket, sys, time\n"
        "for _ in range(400):\n"
        f"    try: c = socket.create_connection((sys.argv[1], {PORT})); break\n"
        "    except OSError: time.sleep(0.025)\n"
        f"c.sendall(b'x' * {MBYTES * 1_000_000}); c.close()\n")


class Hosts:
    """The module's cluster and the helpers its tests share."""

    def __init__(self, cluster: LocalCluster, status: ClusterStatus, logs: Path) -> None:
        self.cluster = cluster
        self.status = status
        plan = cluster.hosts_plan()
        assert plan is not None
        self.plan: HostPlan = plan
        self.env = dict(cluster.env)
        self.logs = logs

    def srun_argv(self, node: str, *argv: str) -> list[str]:
        return ["srun", "-p", node.split("-")[0], "-w", node, "-N1", "-n1", *argv]

    def srun(self, node: str, *argv: str, check: bool = True) -> CommandResult:
        return run_command(self.srun_argv(node, *argv), env=self.env, timeout_s=60,
                           check=check)

    def sh(self, node: str, script: str) -> str:
        return self.srun(node, "sh", "-c", script).stdout

    def transfer_s(self, src: str, dst: str) -> float:
        """Seconds the receiver on ``dst`` took for MBYTES sent to it from ``src``."""
        log = self.logs / f"recv-{uuid.uuid4().hex[:8]}.out"
        recv = SubprocessRunner().spawn(self.srun_argv(dst, sys.executable, "-c", RECV),
                                        env=self.env, log_path=log)
        try:
            self.srun(src, sys.executable, "-c", SEND, self.plan.node(dst).addr)
            assert recv.wait(timeout=60) == 0, log.read_text()
        finally:
            if recv.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(recv.pid, signal.SIGKILL)
                recv.wait(timeout=10)
        nbytes, seconds = log.read_text().splitlines()[-1].split()
        assert int(nbytes) == MBYTES * 1_000_000
        return float(seconds)


@pytest.fixture(scope="module")
def separate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    base = tmp_path_factory.mktemp("hosts")
    cluster = LocalCluster(base / "cluster")
    try:
        status = cluster.up(LAYOUT, hosts=HostMode.SEPARATE, subnet=free_subnet(),
                            timeout_s=60)
        yield Hosts(cluster, status, base)
    finally:
        cluster.down()


def test_every_host_is_idle_names_itself_and_has_its_own_address(separate: Hosts) -> None:
    st = separate.status
    assert st.ready and st.hosts is HostMode.SEPARATE
    assert [(n.name, n.state, n.gres) for n in st.nodes] == [
        ("h20-0", "idle", "gpu:h20:2"), ("h20-1", "idle", "gpu:h20:2"),
        ("h800-0", "idle", "gpu:h800:2"), ("h800-1", "idle", "gpu:h800:2")]
    addrs = {n.name: n.addr for n in separate.plan.nodes}
    assert len(set(addrs.values())) == 4 and dict(st.addresses)["h20-0"] == addrs["h20-0"]
    for node in NODES:
        out = separate.sh(node, "hostname; ip -4 -o addr show")
        name, *ip_lines = out.splitlines()
        assert name == node
        own = [line for line in ip_lines if " eth0 " in f" {line.split(':')[1]} "]
        assert len(own) == 1 and f" {addrs[node]}/" in own[0], out
        assert not any(f" {a}/" in out for n, a in addrs.items() if n != node), out
        assert f" {separate.plan.login_addr}/" not in out
    gpus = separate.srun("h800-1", "--gres=gpu:h800:2", "sh", "-c",
                         "echo $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS").stdout.split()
    assert gpus == ["0,1", "0,1"], "typed fake GPUs, as on the shared layout"


def test_shm_and_tmp_are_each_hosts_own_and_home_is_shared(separate: Hosts) -> None:
    probe = f"weave-probe-{uuid.uuid4().hex[:8]}"
    home = separate.cluster.shared_paths().home
    separate.sh("h20-0", f"echo a > /dev/shm/{probe}; echo b > /tmp/{probe}; "
                         f"echo shared > {home}/{probe}")
    look = f"for f in /dev/shm/{probe} /tmp/{probe}; do test -e $f && echo $f; done; " \
           f"cat {home}/{probe}"
    assert separate.sh("h20-0", look).split() == [f"/dev/shm/{probe}", f"/tmp/{probe}",
                                                  "shared"], "the node keeps its own files"
    for node in ("h20-1", "h800-0", "h800-1"):
        assert separate.sh(node, look).split() == ["shared"], node
    assert not Path(f"/dev/shm/{probe}").exists() and not Path(f"/tmp/{probe}").exists()
    assert (home / probe).read_text() == "shared\n"


def test_the_login_side_is_hidden_from_the_hosts(separate: Hosts) -> None:
    paths = separate.cluster.paths
    marker = paths.login_dir / "weaved.db"
    marker.write_text("login only")
    state = paths.state_dir
    listing = separate.sh("h800-1", f"ls -A {state}; echo --; ls -A {state}/hosts; "
                                    f"test -e {marker} && echo VISIBLE || true").split()
    assert listing == ["gres.conf", "hosts", "oci.conf", "plugstack.conf", "shared", "site",
                       "slurm.conf", "--", "h800-1"]
    assert paths.ctld_state_dir.is_dir() and paths.run_dir.is_dir(), "they exist, on the login"
    res = run_command(separate.cluster.host_argv("h20-1", ["cat", str(marker)]), check=False)
    assert res.returncode != 0 and "No such file" in res.stderr
    assert run_command(separate.cluster.host_argv("h20-1", ["hostname"])).stdout == "h20-1\n"
    weave = Path(sys.executable).parent / "weave"
    if weave.exists():
        res = run_command([str(weave), "cluster", "exec", "--state-dir", str(state), "h800-0",
                           "--", "hostname"], check=False)
        assert (res.returncode, res.stdout) == (0, "h800-0\n"), res


def test_tcp_across_pools_and_the_shaped_link(separate: Hosts) -> None:
    fast = separate.transfer_s("h20-0", "h800-0")  # unshaped: works, and is fast
    separate.cluster.shape_interpool(SHAPED_GBPS)
    try:
        ideal = MBYTES * 8e6 / (SHAPED_GBPS * 1e9)
        up = separate.transfer_s("h20-0", "h800-0")
        down = separate.transfer_s("h800-1", "h20-1")
        intra = separate.transfer_s("h800-0", "h800-1")
    finally:
        separate.cluster.shape_interpool(None)
    again = separate.transfer_s("h20-1", "h800-1")
    rates = {k: MBYTES * 8e6 / v / 1e9 for k, v in
             (("unshaped", fast), ("h20->h800", up), ("h800->h20", down), ("intra", intra),
              ("unshaped again", again))}
    print("Gbit/s:", {k: round(v, 3) for k, v in rates.items()})
    assert up >= 0.7 * ideal and down >= 0.7 * ideal, rates
    assert up <= 3 * ideal and down <= 3 * ideal, rates
    assert intra < up / 4 and fast < up / 4 and again < up / 4, rates


def test_down_kills_steps_and_removes_every_namespace_and_link(separate: Hosts) -> None:
    plan = separate.plan
    srun = SubprocessRunner().spawn(separate.srun_argv("h800-1", "sleep", "1000"),
                                    env=separate.env, log_path=separate.logs / "sleep.out")
    try:
        ids = hosts.namespace_ids(plan)
        sleeper = _wait_for_sleep(ids)
        stopped = LocalCluster(separate.cluster.paths.state_dir).down()  # a fresh instance
        assert "slurmd-h800-1" in stopped and "munged-h800-1" in stopped
        assert any(s.endswith("other processes on h800-1") for s in stopped), stopped
        # the srun started here (and the child it forks) is the cluster's too
        assert any(s.endswith("other processes on the login side") for s in stopped), stopped
        assert srun.wait(timeout=10) is not None
        assert carrying_conf(separate.cluster.paths.slurm_conf) == {}
        assert not Path(f"/proc/{sleeper}").exists() or \
            "sleep" not in Path(f"/proc/{sleeper}/cmdline").read_text()
        assert hosts.processes_in(ids) == {}
        links = hosts.link_names(SubprocessRunner())
        assert not set(plan.interfaces()) & links
        assert not {n.netns for n in plan.nodes} & hosts.netns_names(SubprocessRunner())
        assert not plan.ns_dir.exists()
        assert not any(str(m).startswith(str(plan.ns_dir)) for m in hosts.mount_points())
        assert LocalCluster(separate.cluster.paths.state_dir).down() == [], "idempotent"
    finally:
        with contextlib.suppress(ProcessLookupError):  # srun and the child it forks
            os.killpg(srun.pid, signal.SIGKILL)
        srun.wait(timeout=10)


def _wait_for_sleep(ids: dict[tuple[int, int], str]) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for pid, (_, node) in hosts.processes_in(ids).items():
            with contextlib.suppress(OSError):
                if node == "h800-1" and Path(f"/proc/{pid}/comm").read_text() == "sleep\n":
                    return pid
        time.sleep(0.05)
    raise AssertionError("the sleep step never started on h800-1")
