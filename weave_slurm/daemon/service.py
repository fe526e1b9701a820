"""weaved's life cycle: lock the state dir, open the store, serve the socket, reconcile.

One daemon per state directory (a file lock). Stopping it (SIGTERM) leaves every
allocation and step in place: the next start adopts them. Layout of the state dir
(mode 0755)::

    weaved.lock   the life lock        weaved.db (+ -wal, -shm)  the store, mode 0600
    weaved.sock   the API, mode 0666   scripts/  rendered node-daemon scripts
    logs/         step logs            local/    the local backend's records
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from weave_slurm.clock import SystemClock
from weave_slurm.config.oci import oci_conf_path
from weave_slurm.config.runtime import RuntimeConfig, transfer_refusal
from weave_slurm.config.site import SiteConfig, default_site, load_site
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.api import Api
from weave_slurm.daemon.client import SOCKET_NAME
from weave_slurm.daemon.driver import Driver, DriverKind, IdleDriver
from weave_slurm.daemon.group_runtime import GroupRuntime, GroupRuntimeConfig
from weave_slurm.daemon.node_daemons import NodeDaemons, NodeDaemonSettings
from weave_slurm.daemon.reconcile import PoolRequest, Reconciler
from weave_slurm.daemon.server import ApiServer
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.placement import Capacity
from weave_slurm.slurm.accounting import read_accounting
from weave_slurm.slurm.backend import Backend
from weave_slurm.slurm.command_runner import SubprocessRunner
from weave_slurm.slurm.factory import make_backend

if TYPE_CHECKING:
    from weave_slurm.daemon.metrics import WeavedMetrics
    from weave_slurm.runtime.port import GroupPort

log = logging.getLogger(__name__)

_INSTANCE_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = Path(".state/weaved")
    socket_path: Path | None = None  # default <state_dir>/weaved.sock
    backend: str = "local"
    site_path: Path | None = None
    instance: str = ""  # distinguishes daemons sharing one Slurm (allocation names)
    tick_s: float = 1.0
    admin_uids: tuple[int, ...] = ()
    path_roots: tuple[Path, ...] = ()  # shared dirs spec paths may name, besides $HOME
    node_command: tuple[str, ...] | None = None  # default: `weave node serve` per node
    node_socket_dir: Path | None = None  # default <state_dir>/nodes (local), /run/weave
    shm_root: Path = Path("/dev/shm/weave-nodes")
    # a file system weaved and every node share (default <state_dir>/ckpt: one host only)
    checkpoint_root: Path | None = None
    munge_socket: str | None = None    # munged's socket (default $MUNGE_SOCKET, munge's)
    cpus_per_node: int = 2
    immediate_s: int = 10
    client_timeout_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)
    runtime: DriverKind = DriverKind.AUTO   # which driver runs the placed jobs
    runtime_poll_s: float = GroupRuntimeConfig.poll_s
    metrics_port: int | None = None    # the Prometheus endpoint (None: off; 0: any port)
    metrics_addr: str = "127.0.0.1"

    @property
    def socket(self) -> Path:
        return self.socket_path or self.state_dir / SOCKET_NAME

    def validate(self) -> None:
        if self.instance and not set(self.instance) <= _INSTANCE_CHARS:
            raise ConfigError(f"--instance {self.instance!r}: use letters, digits and '_'")
        if self.tick_s <= 0:
            raise ConfigError(f"--tick-s {self.tick_s!r}: must be > 0")
        if self.runtime not in tuple(DriverKind):
            raise ConfigError(f"--runtime {self.runtime!r}: valid choices: "
                              f"{', '.join(k.value for k in DriverKind)}")
        object.__setattr__(self, "runtime", DriverKind(self.runtime))
        if self.cpus_per_node < 1:
            raise ConfigError(f"cpus_per_node={self.cpus_per_node!r}: must be >= 1")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {self.metrics_port!r}: must be a TCP port "
                              "(0-65535; 0: any free port)")


def capacity_for(site: SiteConfig, backend: Backend) -> Capacity:
    """The site's capacity, with each pool clamped to the nodes the backend really has;
    co-location as the site's ``[limits] colocation`` says (unset: off), pooled rollout
    as its ``[limits] rollout`` (daemon/pooling.py)."""
    cap = Capacity.from_site(site, pooled=site.limits.rollout == "pooled")
    try:
        nodes = backend.nodes()
    except WeaveError as exc:
        log.warning("cannot list the backend's nodes (%s); using the site's max_nodes", exc)
        return cap
    count = {p: sum(p in n.partitions for n in nodes)
             for p in (site.rollout.partition, site.train.partition)}
    return replace(cap, rollout_pool_nodes=min(cap.rollout_pool_nodes,
                                               count[site.rollout.partition] or 10**9),
                   train_pool_nodes=min(cap.train_pool_nodes,
                                        count[site.train.partition] or 10**9))


class Weaved:
    """The daemon: build with a config, :meth:`run` in the foreground, :meth:`stop`."""

    def __init__(self, config: DaemonConfig, backend: Backend | None = None,
                 driver: Driver | None = None) -> None:
        config.validate()
        self.config = config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(config.state_dir, 0o755)
        # not thread-local: run() (maybe another thread) releases what __init__ took
        self._lock = FileLock(str(config.state_dir / "weaved.lock"), thread_local=False)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise StateError(f"another weaved holds {str(config.state_dir)!r}; stop it first") \
                from None
        try:
            self._setup(backend, driver)
        except BaseException:
            self._lock.release()
            raise

    def _setup(self, backend: Backend | None, driver: Driver | None) -> None:
        cfg = self.config
        self._wake = threading.Event()
        self._stop = threading.Event()
        db = cfg.state_dir / "weaved.db"
        self.store = Store(db)
        os.chmod(db, 0o600)
        self.site = load_site(cfg.site_path) if cfg.site_path else default_site()
        self.backend = backend or make_backend(
            cfg.backend, state_dir=cfg.state_dir / "local", env=cfg.env or None,
            log_dir=cfg.state_dir / "logs", template=self.site.slurm.allocation_template)
        refusal = transfer_refusal(self.site.runtime, self.backend.kind != "local")
        if refusal is not None:
            raise ConfigError(f"{self.site.source}: {refusal}")
        self.capacity = capacity_for(self.site, self.backend)
        self.accounting = self._accounting_feed()
        self.nodes = NodeDaemons(NodeDaemonSettings(
            state_dir=cfg.state_dir, instance=cfg.instance,
            remote=self.backend.kind != "local", node_command=cfg.node_command,
            node_socket_dir=cfg.node_socket_dir, shm_root=cfg.shm_root,
            checkpoint_root=cfg.checkpoint_root,
            munge_socket=cfg.munge_socket or cfg.env.get("MUNGE_SOCKET")
            or os.environ.get("MUNGE_SOCKET")),
            self.site, self.backend)
        self.clock = SystemClock()
        self.metrics: WeavedMetrics | None = None
        if cfg.metrics_port is not None:   # prometheus_client is imported only then
            from weave_slurm.daemon.metrics import WeavedMetrics

            self.metrics = WeavedMetrics(self.store, self._runners)
        self.driver = driver or self._default_driver()
        self.driver.wake = self._wake_loop
        pools = {role: PoolRequest(p.partition, p.gpus_per_node, p.gpu.name, cfg.cpus_per_node)
                 for role, p in (("rollout", self.site.rollout), ("train", self.site.train))}
        self.reconciler = Reconciler(self.store, self.backend, self.capacity, pools,
                                     self.driver, self.clock, site=self.site, instance=cfg.instance,
                                     node_step=self.nodes.step, immediate_s=cfg.immediate_s,
                                     on_placement=self.metrics.placed if self.metrics else None,
                                     replan=self._replan_config(), accounting=self.accounting)
        self.api = Api(self.store, self.site, self.capacity, self.clock.now,
                       admin_uids=cfg.admin_uids, path_roots=cfg.path_roots,
                       wake=self._wake.set,
                       phase=self.driver.phase, live=self.driver.live,
                       waiting=self.driver.waiting,
                       world_error=lambda: self.reconciler.world_error,
                       node_python=self.nodes.s.python if cfg.node_command is None else None,
                       oci_conf=oci_conf_path({**os.environ, **cfg.env}),
                       accounting=self.accounting)
        self.metrics_port = None if self.metrics is None or cfg.metrics_port is None \
            else self.metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        try:
            self.server = ApiServer(cfg.socket, self.api, client_timeout_s=cfg.client_timeout_s)
        except BaseException:
            if self.metrics is not None:
                self.metrics.close()
            raise

    def _accounting_feed(self) -> AccountingFeed | None:
        """Slurm's association and QOS limits, with ``[limits] from_slurm`` (read with
        sacctmgr in weaved's Slurm environment; docs/fairshare.md)."""
        lim = self.site.limits
        if not lim.from_slurm:
            return None
        if self.backend.kind == "local":
            raise ConfigError(f"{self.site.source}: key 'limits.from_slurm' = true reads "
                              "Slurm's accounting, but weaved runs the local backend (no "
                              "Slurm): set it to false, or run weaved with --backend slurm")
        env = self.config.env or None
        return AccountingFeed(lambda: read_accounting(SubprocessRunner(), env,
                                                      lim.slurm_cluster), lim.slurm_refresh_s)

    def _replan_config(self) -> RuntimeConfig | None:
        """Re-planning running jobs, where weaved can move them (daemon/replanning.py):
        its group runtime, with node checkpoints on a file system it shares."""
        rt = self.site.runtime
        if not isinstance(self.driver, GroupRuntime) or self.driver.config.checkpoint_base \
                is None or (rt.replan_interval_s == 0 and not rt.consolidate
                            and rt.recent_jobs == 0):
            log.info("weaved: running jobs are not re-planned (%s)",
                     "switched off in [runtime]" if isinstance(self.driver, GroupRuntime)
                     and self.driver.config.checkpoint_base is not None
                     else "moving a job needs weaved's group runtime and node checkpoints "
                          "on a shared file system")
            return None
        return rt

    def _runners(self) -> dict[int, GroupPort]:
        """The groups running now, by their ports (the metrics' bubbles read them)."""
        return dict(self.driver.ports) if isinstance(self.driver, GroupRuntime) else {}

    def _wake_loop(self) -> None:
        self._wake.set()

    def _default_driver(self) -> Driver:
        cfg = self.config
        rl = cfg.runtime is DriverKind.RL or (cfg.runtime is DriverKind.AUTO
                                              and cfg.node_command is None)
        if not rl:
            return IdleDriver()
        from weave_slurm.runtime.member import RunnerConfig

        base = self.nodes.checkpoint_base
        runner = RunnerConfig.from_site(self.site.runtime, munge_socket=self.nodes.s.munge_socket,
                                        checkpoint_base=base)
        return GroupRuntime(self.nodes.ref, GroupRuntimeConfig(
            poll_s=cfg.runtime_poll_s, runner=runner, checkpoint_base=base),
            launcher=self.nodes.launch_agent if self.nodes.s.remote else None,
            resolve=self.nodes.resolve if self.nodes.s.remote else None,
            observer=self.metrics.runtime if self.metrics else None,
            node_key=self.nodes.node_key)

    def run(self) -> None:
        """Serve and reconcile until :meth:`stop`."""
        server = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="weaved-api", daemon=True)
        server.start()
        log.info("weaved: serving %s, backend %s, instance %r", self.config.socket,
                 self.backend.kind, self.config.instance)
        self.driver.start()
        try:
            while not self._stop.is_set():
                try:
                    self.reconciler.tick()
                except WeaveError as exc:   # e.g. squeue failing: status warns meanwhile
                    log.warning("reconcile tick skipped: %s", exc)
                except Exception:
                    log.exception("reconcile tick failed; the next one will retry")
                self._wake.wait(self.config.tick_s)
                self._wake.clear()
        finally:
            self.driver.close()
            if self.metrics is not None:
                self.metrics.close()
            self.server.shutdown()
            self.server.server_close()
            self.store.close()
            self._lock.release()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
