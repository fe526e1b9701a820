"""The local, one-host Slurm cluster: ``up``, ``down``, ``status``.

``up`` writes slurm.conf/gres.conf/plugstack.conf into a state directory, starts a
private munged (its own socket under the state dir; the system one if that
fails), ``slurmctld -i``, waits for ``scontrol ping`` to say UP while watching the
slurmctld pid, starts one ``slurmd -N <node>`` per node, and waits until every
node is idle. It is idempotent: a cluster that is already up is left alone.
``down`` stops exactly the processes ``up`` started (pid files with start times).
Clients find the cluster through ``SLURM_CONF`` (see :func:`client_env`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.slurm import daemons
from weave_slurm.slurm.cluster_config import (
    MUNGE_RUN_DIR,
    ClusterLayout,
    ClusterPaths,
    ClusterPorts,
    render_gres_conf,
    render_plugstack_conf,
    render_slurm_conf,
)
from weave_slurm.slurm.runner import CommandRunner, SlurmCommandError, SubprocessRunner

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path(".state/cluster")
SYSTEM_MUNGE_DIR = Path("/run/munge")
_POLL_S = 0.05
_UNUSABLE = ("down", "drain", "fail", "unk", "boot", "maint", "inval", "npc", "futr")


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
        data["ready"] = self.ready
        return data


def client_env(state_dir: Path) -> dict[str, str]:
    """The environment a Slurm client needs to talk to the cluster in ``state_dir``."""
    return {"SLURM_CONF": str(ClusterPaths(state_dir.resolve()).slurm_conf)}


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


class LocalCluster:
    """One local cluster rooted at ``state_dir``."""

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR,
                 runner: CommandRunner | None = None) -> None:
        self.paths = ClusterPaths(state_dir.resolve())
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.env = client_env(self.paths.state_dir)

    # -- reading the world -------------------------------------------------------------

    def _records(self) -> list[daemons.DaemonRecord]:
        if not self.paths.run_dir.is_dir():
            return []
        found = (daemons.read(p) for p in sorted(self.paths.run_dir.glob("*.pid")))
        return [r for r in found if r is not None]

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
        return ClusterStatus(self.paths.state_dir, self.paths.slurm_conf, up, ds,
                             self._nodes() if up else ())

    # -- acting ------------------------------------------------------------------------

    def up(self, layout: ClusterLayout | None = None, *, spank_plugin: Path | None = None,
           socket_dir: Path | None = None, timeout_s: float = 60.0) -> ClusterStatus:
        """Bring the cluster up (or find it up) and return its status."""
        layout = layout or ClusterLayout()
        layout.validate()
        for tool in ("slurmctld", "slurmd", "munged", "scontrol", "sinfo"):
            if shutil.which(tool) is None:
                raise ConfigError(f"weave cluster up: {tool!r} not found on PATH; install "
                                  "the Debian packages slurm-wlm and munge")
        if spank_plugin is not None and not spank_plugin.is_file():
            raise ConfigError(f"--spank: plugin {str(spank_plugin)!r} does not exist; build "
                              "it with 'make -C spank'")
        current = self.status()
        if current.ready and self._same_layout(layout):
            return replace(current, already_up=True)
        t0 = time.monotonic()
        self.down()
        try:
            self._start(layout, spank_plugin, socket_dir, timeout_s)
        except Exception:
            self.down()
            raise
        final = self.status()
        return replace(final, up_s=time.monotonic() - t0)

    def _same_layout(self, layout: ClusterLayout) -> bool:
        try:
            manifest = json.loads(self.paths.manifest.read_text())
        except (OSError, ValueError):
            return False
        return bool(manifest.get("nodes") == list(layout.node_names()))

    def _start(self, layout: ClusterLayout, spank_plugin: Path | None,
               socket_dir: Path | None, timeout_s: float) -> None:
        p = self.paths
        for d in (p.run_dir, p.log_dir, p.ctld_state_dir):
            d.mkdir(parents=True, exist_ok=True)
        for node in layout.node_names():
            p.spool_dir(node).mkdir(parents=True, exist_ok=True)
            p.tmpfs_dir(node).mkdir(parents=True, exist_ok=True)
        self._make_gpu_files(layout)
        munge_socket = self._start_munge(timeout_s)
        ports = ClusterPorts(_free_port(),
                             tuple((n, _free_port()) for n in layout.node_names()))
        p.slurm_conf.write_text(render_slurm_conf(layout, p, ports, munge_socket))
        p.gres_conf.write_text(render_gres_conf(layout, p))
        p.plugstack_conf.write_text(render_plugstack_conf(
            spank_plugin.resolve() if spank_plugin else None, socket_dir))
        env = {**os.environ, **self.env}
        ctld = daemons.start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(p.slurm_conf)],
                             pid_file=p.pid_file("slurmctld"),
                             log_file=p.log_dir / "slurmctld.out", env=env)
        _wait("slurmctld (scontrol ping)", self._ping, lambda: daemons.is_alive(ctld),
              timeout_s, lambda: daemons.log_tail(p.log_dir / "slurmctld.log"))
        started = [ctld]
        for node in layout.node_names():
            started.append(daemons.start(
                f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(p.slurm_conf)],
                pid_file=p.pid_file(f"slurmd-{node}"),
                log_file=p.log_dir / f"slurmd-{node}.out", env=env))
        want = set(layout.node_names())

        def all_idle() -> bool:
            nodes = self._nodes()
            return {n.name for n in nodes if n.state == "idle"} >= want

        _wait("slurmd nodes idle in sinfo", all_idle,
              lambda: all(daemons.is_alive(r) for r in started), timeout_s,
              lambda: f"sinfo: {[(n.name, n.state) for n in self._nodes()]}")
        manifest = {"nodes": list(layout.node_names()), "ports": asdict(ports),
                    "munge_socket": str(munge_socket) if munge_socket else None,
                    "spank_plugin": str(spank_plugin) if spank_plugin else None}
        p.manifest.write_text(json.dumps(manifest, indent=2) + "\n")

    def _make_gpu_files(self, layout: ClusterLayout) -> None:
        """Fake GPU device files: symlinks to /dev/null (Slurm wants character devices)."""
        for pool in layout.pools:
            for node in pool.node_names():
                d = self.paths.gpu_dir(node)
                d.mkdir(parents=True, exist_ok=True)
                for i in range(pool.gpus_per_node):
                    link = d / f"nvidia{i}"
                    if not link.is_symlink():
                        link.symlink_to("/dev/null")

    def _munge_ok(self, sock: Path | None) -> bool:
        argv = ["munge", "-n"] + ([f"--socket={sock}"] if sock else [])
        try:
            return self.runner.run(argv, timeout_s=5, check=False).returncode == 0
        except SlurmCommandError:
            return False

    def _start_munge(self, timeout_s: float) -> Path | None:
        """A private munged under the state dir; the system one if that cannot start."""
        d = self.paths.munge_dir
        d.mkdir(parents=True, exist_ok=True)
        if d.parent == MUNGE_RUN_DIR:
            MUNGE_RUN_DIR.chmod(0o755)
        shutil.chown(d, "munge", "munge")
        d.chmod(0o755)  # munged wants the socket dir searchable by all
        sock = self.paths.munge_socket
        rec = daemons.start("munged", ["munged", "-F", f"--socket={sock}",
                                       f"--pid-file={d / 'munged.pid'}",
                                       f"--log-file={d / 'munged.log'}",
                                       f"--seed-file={d / 'munged.seed'}"],
                            pid_file=self.paths.pid_file("munged"),
                            log_file=self.paths.log_dir / "munged.out", user="munge")
        try:
            _wait("private munged", lambda: self._munge_ok(sock),
                  lambda: daemons.is_alive(rec), min(timeout_s, 10.0),
                  lambda: daemons.log_tail(self.paths.log_dir / "munged.out"))
            return sock
        except StateError as exc:
            log.warning("private munged failed (%s); using the system munged", exc)
            daemons.stop(rec)
            self.paths.pid_file("munged").unlink(missing_ok=True)
        if not self._munge_ok(None):
            SYSTEM_MUNGE_DIR.mkdir(parents=True, exist_ok=True)
            shutil.chown(SYSTEM_MUNGE_DIR, "munge", "munge")
            sysrec = daemons.start("munged-system", ["munged", "-F"],
                                   pid_file=self.paths.pid_file("munged-system"),
                                   log_file=self.paths.log_dir / "munged-system.out",
                                   user="munge")
            _wait("system munged", lambda: self._munge_ok(None),
                  lambda: daemons.is_alive(sysrec), min(timeout_s, 10.0),
                  lambda: daemons.log_tail(self.paths.log_dir / "munged-system.out"))
        return None

    def down(self, timeout_s: float = 10.0) -> list[str]:
        """Stop the daemons this cluster started (slurmds, slurmctld, munged, in order)."""
        order = {"slurmctld": 1, "munged": 2, "munged-system": 2}
        records = sorted(self._records(), key=lambda r: order.get(r.name, 0))
        stopped = []
        for rec in records:
            if daemons.stop(rec, timeout_s=timeout_s):
                stopped.append(rec.name)
            with contextlib.suppress(OSError):
                self.paths.pid_file(rec.name).unlink()
        self.paths.manifest.unlink(missing_ok=True)
        munge_dir = self.paths.munge_dir
        if munge_dir.parent == MUNGE_RUN_DIR and not any(r.name == "munged" and
                                                         daemons.is_alive(r) for r in records):
            shutil.rmtree(munge_dir, ignore_errors=True)
        return stopped
