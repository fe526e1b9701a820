"""The local Slurm cluster: ``up``, ``down``, ``status``, in one of two host modes.

``up`` writes slurm.conf/gres.conf/plugstack.conf into a state directory, starts a
private munged (its own socket under the state dir; the system one if that
fails), ``slurmctld -i``, waits for ``scontrol ping`` to say UP while watching the
slurmctld pid, starts the slurmds, and waits until every node is idle. It is
idempotent: a cluster that is already up is left alone.

- :attr:`HostMode.SHARED` (the default): one ``slurmd -N <node>`` per node on this
  host, all sharing its /dev/shm, /tmp and network (loopback, a port each).
- :attr:`HostMode.SEPARATE`: every node a host of its own (its own network, mount
  and UTS namespaces, own munged; see host_plan.py and hosts.py), on a private
  subnet whose inter-pool link can be shaped (``interpool_gbps``).

``down`` kills every process in the hosts' namespaces (steps included), stops
exactly the login-side processes ``up`` started (pid files with start times), and
removes the namespaces, veths and bridges; it is idempotent and works after a
crash (the host plan is recorded before anything is built). Clients find the
cluster through ``SLURM_CONF`` (see :func:`client_env`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.slurm import daemons
from weave_slurm.slurm import hosts as separate_hosts
from weave_slurm.slurm.cluster_config import (
    MUNGE_RUN_DIR,
    SLURMD_PORT,
    ClusterLayout,
    ClusterPaths,
    ClusterPorts,
    HostMode,
    SharedPaths,
    render_gres_conf,
    render_oci_conf,
    render_plugstack_conf,
    render_slurm_conf,
)
from weave_slurm.slurm.command_runner import CommandRunner, SlurmCommandError, SubprocessRunner
from weave_slurm.slurm.host_plan import (
    DEFAULT_SUBNET,
    HostPlan,
    host_argv,
    plan_hosts,
    render_hosts_file,
)
from weave_slurm.slurm.munge import host_munge_dir, start_host_munge, start_login_munge

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path(".state/cluster")
_POLL_S = 0.05
_UNUSABLE = ("down", "drain", "fail", "unk", "boot", "maint", "inval", "npc", "futr")
_TOOLS = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo")
_HOST_TOOLS = ("ip", "tc", "nsenter", "unshare", "setpriv", "mount")


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``sinfo`` reports it."""

    name: str
    partition: str
    state: str
    gres: str


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon of the cluster and whether it runs."""

    name: str
    pid: int
    alive: bool


@dataclass(frozen=True)
class ClusterStatus:
    """What ``up`` and ``status`` report."""

    state_dir: Path
    slurm_conf: Path
    controller_up: bool
    daemons: tuple[DaemonStatus, ...]
    nodes: tuple[NodeStatus, ...]
    already_up: bool = False
    up_s: float | None = None
    hosts: HostMode = HostMode.SHARED
    addresses: tuple[tuple[str, str], ...] = ()  # (host, address), login first; separate only

    @property
    def ready(self) -> bool:
        """Controller up, every daemon alive, every node responding and usable (busy is ok)."""
        return (self.controller_up and bool(self.nodes) and all(d.alive for d in self.daemons)
                and all(not n.state.startswith(_UNUSABLE) and not n.state.endswith("*")
                        for n in self.nodes))

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        data["slurm_conf"] = str(self.slurm_conf)
        data["hosts"] = self.hosts.value
        data["addresses"] = dict(self.addresses)
        data["ready"] = self.ready
        return data


def client_env(state_dir: Path) -> dict[str, str]:
    """The environment a client needs to talk to the cluster in ``state_dir``: its
    ``SLURM_CONF``, and ``MUNGE_SOCKET`` when the cluster runs a private munged (weaved
    and the node daemons authenticate each other with it)."""
    paths = ClusterPaths(state_dir.resolve())
    env = {"SLURM_CONF": str(paths.slurm_conf)}
    try:
        sock = json.loads(paths.manifest.read_text()).get("munge_socket")
    except (OSError, ValueError, AttributeError):
        sock = None
    if sock:
        env["MUNGE_SOCKET"] = str(sock)
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready: Callable[[], bool], alive: Callable[[], bool],
          timeout_s: float, evidence: Callable[[], str]) -> None:
    """Poll ``ready`` until true; fail fast when ``alive`` turns false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise StateError(f"local cluster: {what}: a daemon died; {evidence()}")
        time.sleep(_POLL_S)
    raise StateError(f"local cluster: {what}: not ready after {timeout_s:g} s; {evidence()}")


def oci_runtime() -> str | None:
    """The OCI runtime oci.conf names: runc, else crun (absolute), else None."""
    return next(filter(None, (shutil.which(t) for t in ("runc", "crun"))), None)


def _check_tools(mode: HostMode) -> None:
    for tool in _TOOLS + (_HOST_TOOLS if mode is HostMode.SEPARATE else ()):
        if shutil.which(tool) is None:
            raise ConfigError(f"weave cluster up: {tool!r} not found on PATH; install "
                              "the Debian packages slurm-wlm, munge, iproute2 and util-linux")
    if mode is HostMode.SEPARATE and os.geteuid() != 0:
        raise ConfigError("weave cluster up --hosts separate: needs root (it creates network "
                          "and mount namespaces)")


class LocalCluster:
    """One local cluster rooted at ``state_dir``."""

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR,
                 runner: CommandRunner | None = None) -> None:
        self.paths = ClusterPaths(state_dir.resolve())
        self.runner: CommandRunner = runner or SubprocessRunner()

    # -- reading the world -------------------------------------------------------------

    def _records(self) -> list[daemons.DaemonRecord]:
        if not self.paths.run_dir.is_dir():
            return []
        found = (daemons.read(p) for p in sorted(self.paths.run_dir.glob("*.pid")))
        return [r for r in found if r is not None]

    @property
    def env(self) -> dict[str, str]:
        """What clients of this cluster need in their environment (:func:`client_env`)."""
        return client_env(self.paths.state_dir)

    def _manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.paths.manifest.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _ping(self) -> bool:
        if not self.paths.slurm_conf.exists():
            return False
        try:
            res = self.runner.run(["scontrol", "ping"], timeout_s=10, env=self.env, check=False)
        except SlurmCommandError:
            return False
        return res.returncode == 0 and " is UP" in res.stdout

    def _nodes(self) -> tuple[NodeStatus, ...]:
        try:
            res = self.runner.run(["sinfo", "-h", "-N", "-o", "%N|%P|%t|%G"], timeout_s=10,
                                  env=self.env, check=False)
        except SlurmCommandError:
            return ()
        if res.returncode != 0:
            return ()
        out = []
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4:
                out.append(NodeStatus(parts[0], parts[1].rstrip("*"), parts[2], parts[3]))
        return tuple(sorted(out, key=lambda n: n.name))

    def status(self) -> ClusterStatus:
        records = self._records()
        ds = tuple(DaemonStatus(r.name, r.pid, daemons.is_alive(r)) for r in records)
        ctld_alive = any(d.name == "slurmctld" and d.alive for d in ds)
        up = ctld_alive and self._ping()
        plan = self.hosts_plan()
        addresses = (((plan.login_name, plan.login_addr), *((n.name, n.addr) for n in plan.nodes))
                     if plan else ())
        return ClusterStatus(self.paths.state_dir, self.paths.slurm_conf, up, ds,
                             self._nodes() if up else (),
                             hosts=HostMode.SEPARATE if plan else HostMode.SHARED,
                             addresses=addresses)

    def hosts_plan(self) -> HostPlan | None:
        """The separate hosts of this cluster (names, addresses, namespaces); None if shared."""
        return separate_hosts.read_plan(self.paths.state_dir)

    def shared_paths(self) -> SharedPaths:
        """The shared file systems (home, work, ckpt): visible on every host and the login."""
        return self.paths.shared

    def host_argv(self, node: str, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
        """``argv`` wrapped to run on ``node``'s host (its namespaces), as root."""
        return host_argv(self._plan_or_fail("host_argv").node(node), argv, cwd)

    def _plan_or_fail(self, what: str) -> HostPlan:
        plan = self.hosts_plan()
        if plan is None:
            raise StateError(f"{what}: the cluster in {self.paths.state_dir} has no separate "
                             "hosts; bring it up with 'weave cluster up --hosts separate'")
        return plan

    # -- acting ------------------------------------------------------------------------

    def shape_interpool(self, gbps: float | None) -> None:
        """Shape the link between the pools to ``gbps`` both ways; None removes shaping."""
        separate_hosts.shape(self._plan_or_fail("shape"), gbps, self.runner)
        manifest = self._manifest()
        if manifest:
            manifest["interpool_gbps"] = gbps
            self.paths.manifest.write_text(json.dumps(manifest, indent=2) + "\n")

    def up(self, layout: ClusterLayout | None = None, *, hosts: HostMode = HostMode.SHARED,
           subnet: str | None = None, interpool_gbps: float | None = None,
           spank_plugin: Path | None = None, socket_dir: Path | None = None,
           timeout_s: float = 60.0) -> ClusterStatus:
        """Bring the cluster up (or find it up) and return its status.

        ``subnet`` and ``interpool_gbps`` apply to ``hosts=HostMode.SEPARATE`` only.
        """
        layout = layout or ClusterLayout()
        layout.validate()
        if hosts is HostMode.SHARED and (subnet is not None or interpool_gbps is not None):
            raise ConfigError("--subnet/--interpool-gbps: only with --hosts separate")
        if interpool_gbps is not None and interpool_gbps <= 0:
            raise ConfigError(f"--interpool-gbps: {interpool_gbps!r} must be > 0")
        _check_tools(hosts)
        if spank_plugin is not None and not spank_plugin.is_file():
            raise ConfigError(f"--spank: plugin {str(spank_plugin)!r} does not exist; build "
                              "it with 'make -C spank'")
        plan = self.hosts_plan()
        if subnet is None and hosts is HostMode.SEPARATE:   # ours again, else a free one
            subnet = plan.subnet if plan is not None else \
                separate_hosts.free_subnet(self.runner, DEFAULT_SUBNET)
        subnet = subnet or DEFAULT_SUBNET
        current = self.status()
        if current.ready and self._same_layout(layout, hosts, subnet):
            if hosts is HostMode.SEPARATE:
                self.shape_interpool(interpool_gbps)
            return replace(current, already_up=True)
        t0 = time.monotonic()
        self.down()
        try:
            self._start(layout, hosts, subnet, interpool_gbps, spank_plugin, socket_dir,
                        timeout_s)
        except Exception:
            with contextlib.suppress(Exception):
                self.down()
            raise
        final = self.status()
        return replace(final, up_s=time.monotonic() - t0)

    def _same_layout(self, layout: ClusterLayout, mode: HostMode, subnet: str) -> bool:
        m = self._manifest()
        plan = self.hosts_plan()
        return bool(m.get("nodes") == list(layout.node_names())
                    and m.get("hosts", HostMode.SHARED.value) == mode.value
                    and (plan is None or plan.subnet == subnet))

    def _start(self, layout: ClusterLayout, mode: HostMode, subnet: str,
               interpool_gbps: float | None, spank_plugin: Path | None,
               socket_dir: Path | None, timeout_s: float) -> None:
        p = self.paths
        self._make_dirs(layout, mode)
        munge_socket = start_login_munge(p, self.runner, _wait, timeout_s)
        plan = (plan_hosts(p.state_dir, layout, subnet, socket.gethostname().split(".")[0])
                if mode is HostMode.SEPARATE else None)
        ports = ClusterPorts(_free_port(), tuple(
            (n, SLURMD_PORT if plan else _free_port()) for n in layout.node_names()))
        if spank_plugin is not None and plan:  # site software every host can read
            spank_plugin = Path(shutil.copy2(spank_plugin, p.site_dir / spank_plugin.name))
        p.slurm_conf.write_text(render_slurm_conf(layout, p, ports, munge_socket,
                                                  plan.addressing() if plan else None))
        p.gres_conf.write_text(render_gres_conf(layout, p, mode))
        p.plugstack_conf.write_text(render_plugstack_conf(
            spank_plugin.resolve() if spank_plugin else None, socket_dir))
        p.oci_conf.write_text(render_oci_conf(oci_runtime()))
        host_munge = host_munge_dir(p, private=munge_socket is not None)
        if plan is not None:
            (p.site_dir / "hosts").write_text(render_hosts_file(plan))
            separate_hosts.create(plan, p, host_munge, self.runner)
            if interpool_gbps is not None:
                separate_hosts.shape(plan, interpool_gbps, self.runner)
        self._start_daemons(layout, plan, host_munge, timeout_s)
        manifest = {"nodes": list(layout.node_names()), "hosts": mode.value,
                    "ports": asdict(ports),
                    "munge_socket": str(munge_socket) if munge_socket else None,
                    "spank_plugin": str(spank_plugin) if spank_plugin else None,
                    "shared": p.shared.to_json(), "login_dir": str(p.login_dir),
                    "network": plan.to_json() if plan else None,
                    "interpool_gbps": interpool_gbps}
        p.manifest.write_text(json.dumps(manifest, indent=2) + "\n")

    def _make_dirs(self, layout: ClusterLayout, mode: HostMode) -> None:
        p = self.paths
        for d in (p.run_dir, p.log_dir, p.ctld_state_dir, p.login_dir, p.site_dir,
                  *p.shared.all()):
            d.mkdir(parents=True, exist_ok=True)
        for node in layout.node_names():
            p.node_spool_dir(node, mode).mkdir(parents=True, exist_ok=True)
            if mode is HostMode.SHARED:
                p.tmpfs_dir(node).mkdir(parents=True, exist_ok=True)
        self._make_gpu_files(layout, mode)

    def _start_daemons(self, layout: ClusterLayout, plan: HostPlan | None, host_munge: Path,
                       timeout_s: float) -> None:
        """slurmctld, each host's munged (separate hosts), the slurmds; wait for idle nodes."""
        p = self.paths
        env = {**os.environ, **self.env}
        # no jobs from an earlier run (-c): every step running at the last down died with it
        ctld = daemons.start("slurmctld", ["slurmctld", "-D", "-i", "-c", "-f",
                                           str(p.slurm_conf)],
                             pid_file=p.pid_file("slurmctld"),
                             log_file=p.log_dir / "slurmctld.out", env=env)
        host_munged = (start_host_munge(plan, p, host_munge, self.runner, _wait, timeout_s)
                       if plan else [])
        _wait("slurmctld (scontrol ping)", self._ping, lambda: daemons.is_alive(ctld),
              timeout_s, lambda: daemons.log_tail(p.log_dir / "slurmctld.log"))
        started = [ctld, *host_munged, *self._start_slurmds(layout, plan, env)]
        want = set(layout.node_names())

        def all_idle() -> bool:
            nodes = self._nodes()
            return {n.name for n in nodes if n.state == "idle"} >= want

        _wait("slurmd nodes idle in sinfo", all_idle,
              lambda: all(daemons.is_alive(r) for r in started), timeout_s,
              lambda: f"sinfo: {[(n.name, n.state) for n in self._nodes()]}")

    def _start_slurmds(self, layout: ClusterLayout, plan: HostPlan | None,
                       env: dict[str, str]) -> list[daemons.DaemonRecord]:
        """One slurmd per node: ``-N <node>`` here, or on its own host (by its hostname)."""
        p = self.paths
        out = []
        for node in layout.node_names():
            argv = (host_argv(plan.node(node), ["slurmd", "-D", "-f", str(p.slurm_conf)])
                    if plan else ["slurmd", "-D", "-N", node, "-f", str(p.slurm_conf)])
            out.append(daemons.start(f"slurmd-{node}", argv, pid_file=p.pid_file(f"slurmd-{node}"),
                                     log_file=p.log_dir / f"slurmd-{node}.out", env=env))
        return out

    def _make_gpu_files(self, layout: ClusterLayout, mode: HostMode) -> None:
        """Fake GPU device files: symlinks to /dev/null (Slurm wants character devices)."""
        for pool in layout.pools:
            for node in pool.node_names():
                d = self.paths.node_gpu_dir(node, mode)
                d.mkdir(parents=True, exist_ok=True)
                for i in range(pool.gpus_per_node):
                    link = d / f"nvidia{i}"
                    if not link.is_symlink():
                        link.symlink_to("/dev/null")

    def down(self, timeout_s: float = 10.0) -> list[str]:
        """Stop every process of this cluster; the names of what was running.

        slurmctld first (no step starts after it). Then, all at once, the slurmds and
        every other process of the cluster: on separate hosts everything in their
        namespaces (munged, slurmstepd, tasks, anything entered with nsenter), and on
        either side every step, task and client of this cluster
        (:func:`~weave_slurm.slurm.daemons.clients_of`: its ``SLURM_CONF``, e.g. an
        ``srun`` started on the login side); SIGTERM, then SIGKILL (the recorded
        daemons after ``timeout_s``, the others after 1 s). Then the login's munged,
        then the namespaces, veths and bridges. Raises StateError if any is left.
        """
        order = {"slurmctld": 1, "munged": 2, "munged-system": 2}
        records = sorted(self._records(), key=lambda r: order.get(r.name, 0))
        alive = [r for r in records if daemons.is_alive(r)]
        stopped = [r.name for r in alive]
        for rec in records:
            if rec.name == "slurmctld":
                daemons.stop(rec, timeout_s=timeout_s)
        plan = self.hosts_plan()
        nodes = [r for r in alive if r.name not in order]   # slurmds, hosts' munged
        swept = daemons.sweep(lambda: self._processes(plan, nodes, {r.pid for r in alive}),
                              {r.pid for r in nodes}, grace_s=timeout_s,
                              what=f"local cluster {self.paths.state_dir}")
        others = Counter(where for pid, where in swept.items()
                         if pid not in {r.pid for r in nodes})
        stopped += [f"{count} other processes on {where}"
                    for where, count in sorted(others.items())]
        for rec in records:
            daemons.stop(rec, timeout_s=timeout_s)
            with contextlib.suppress(OSError):
                self.paths.pid_file(rec.name).unlink()
        if plan is not None:
            separate_hosts.destroy(plan, self.runner)
        self.paths.manifest.unlink(missing_ok=True)
        munge_dir = self.paths.munge_dir
        if munge_dir.parent == MUNGE_RUN_DIR and not any(r.name == "munged" and
                                                         daemons.is_alive(r) for r in records):
            shutil.rmtree(munge_dir, ignore_errors=True)
        return stopped

    def _processes(self, plan: HostPlan | None, nodes: Sequence[daemons.DaemonRecord],
                   recorded: set[int]) -> dict[int, tuple[int, str]]:
        """pid -> (start ticks, where) of every process of the cluster but the login's
        daemons: the node daemons ``nodes``, the steps, tasks and clients that name its
        ``slurm.conf``, and on separate hosts everything in the hosts' namespaces."""
        table = daemons.process_table()
        here = "the login side" if plan else "this host"
        found = {pid: (p.ticks, here) for pid, p in
                 daemons.clients_of(self.paths.slurm_conf, table, spare=recorded).items()}
        found.update({r.pid: (r.start_ticks, r.name) for r in nodes if r.pid in table})
        if plan is not None:
            found.update(separate_hosts.processes_in(separate_hosts.namespace_ids(plan), table))
        return found
