"""The layout and the config files of the local Slurm cluster.

Pure: given a layout, a state directory and ports, render ``slurm.conf``,
``gres.conf``, ``plugstack.conf`` and ``oci.conf``, for either host mode (:class:`HostMode`): all
nodes on this host (``slurmd -N``, loopback, a port each) or every node a host of
its own (:class:`HostAddressing`: its own address and hostname, see host_plan.py).
The settings are the ones verified on this kind of machine (see docs/slurm.md):
linuxproc process tracking, no task plugin, cons_tres with CR_Core, backfill every
second (heterogeneous jobs start only by backfill), ``config_overrides`` so a node
may advertise more CPUs than the host has, accounting off, fake typed GPUs whose
device files are symlinks to /dev/null.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import member_of

CLUSTER_NAME = "weave"
MUNGE_RUN_DIR = Path("/run/weave-munge")
SPOOL_RUN_DIR = Path("/run/weave-slurmd")
#: A slurmstepd listens on ``<spool dir>/<node>_<job id>.<step id>``: a batch step's id is
#: 4294967291 and a job id has up to 10 digits; a Unix socket path holds at most 107
#: bytes. Node names of a local cluster are assumed at most 16 characters long.
_STEPD_SOCKET_TAIL = len("_4294967295.4294967291")
_SOCKET_PATH_MAX = 107
_NODE_NAME_MAX = 16
SLURMD_PORT = 6818  # Slurm's own default; every separate host can use it


class HostMode(enum.StrEnum):
    """Where the cluster's nodes run."""

    SHARED = "shared"      # every slurmd on this host: one /dev/shm, /tmp and network
    SEPARATE = "separate"  # every node a host of its own (namespaces; see host_plan.py)

    @classmethod
    def parse(cls, value: str) -> HostMode:
        return member_of(cls, value, "--hosts: {value} is not a host mode; choose from "
                                     "{choices}")


@dataclass(frozen=True)
class PoolShape:
    """One partition of identical nodes: ``<partition>-<i>`` with ``gpus_per_node`` GPUs."""

    partition: str
    gpu_type: str
    node_count: int
    gpus_per_node: int = 8
    cpus_per_node: int = 32
    real_memory_mib: int = 4096

    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.partition}-{i}" for i in range(self.node_count))


@dataclass(frozen=True)
class ClusterLayout:
    """The pools of the local cluster; the default is 2 h20 + 2 h800 nodes."""

    pools: tuple[PoolShape, ...] = (PoolShape("h20", "h20", 2), PoolShape("h800", "h800", 2))

    def node_names(self) -> tuple[str, ...]:
        return tuple(name for pool in self.pools for name in pool.node_names())

    def validate(self) -> None:
        seen: set[str] = set()
        for pool in self.pools:
            if pool.partition in seen:
                raise ConfigError(f"cluster layout: partition {pool.partition!r} given twice")
            seen.add(pool.partition)
            for key, value in (("node_count", pool.node_count),
                               ("gpus_per_node", pool.gpus_per_node),
                               ("cpus_per_node", pool.cpus_per_node)):
                if value < 1:
                    raise ConfigError(f"cluster layout: pool {pool.partition!r} {key}="
                                      f"{value!r}; must be >= 1")


def parse_layout(spec: str) -> ClusterLayout:
    """Parse ``"h20=2,h800=2"`` (partition=nodes; the GPU type is the partition name)."""
    pools: list[PoolShape] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, count = part.partition("=")
        if not sep or not name or not count.isdigit():
            raise ConfigError(f"--nodes: bad item {part!r} in {spec!r}; expected "
                              "PARTITION=COUNT items, e.g. 'h20=2,h800=2'")
        pools.append(PoolShape(name, name, int(count)))
    if not pools:
        raise ConfigError(f"--nodes: {spec!r} names no pool; e.g. 'h20=2,h800=2'")
    layout = ClusterLayout(tuple(pools))
    layout.validate()
    return layout


@dataclass(frozen=True)
class ClusterPaths:
    """Where everything of one local cluster lives, all under ``state_dir``."""

    state_dir: Path

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.state_dir / "gres.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.state_dir / "plugstack.conf"

    @property
    def oci_conf(self) -> Path:
        """Slurm reads it beside slurm.conf (``srun --container``); weave's node daemons too."""
        return self.state_dir / "oci.conf"

    @property
    def manifest(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def munge_dir(self) -> Path:
        """Under the state dir if munged can reach it there; else a short dir in /run.

        munged (as the munge user) needs every ancestor searchable by others and a
        unix socket path under ~100 bytes; pytest's 0700 temp dirs fail the first.
        """
        local = self.state_dir / "munge"
        if len(str(local / "munge.socket.2")) < 100 and all(
                p.stat().st_mode & 0o001 for p in self.state_dir.parents if p.exists()) \
                and (not self.state_dir.exists() or self.state_dir.stat().st_mode & 0o001):
            return local
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        return MUNGE_RUN_DIR / digest

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket.2"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def ctld_state_dir(self) -> Path:
        return self.state_dir / "ctld"

    def spool_dir(self, node: str) -> Path:
        return self.state_dir / "spool" / node

    @property
    def spool_in_run(self) -> bool:
        """True when a slurmstepd socket in a spool dir under the state dir could pass the
        length of a Unix socket path (a long state dir, e.g. pytest's): the spool dirs
        then go to a short per-cluster dir in /run (each separate host's own /run).
        Otherwise Slurm cannot start a batch job there ("Unix socket name exceeded
        maximum length"), while steps, whose ids are short, still start."""
        longest = self.state_dir / "hosts" / ("n" * _NODE_NAME_MAX) / "spool"
        return len(str(longest)) + 1 + _NODE_NAME_MAX + _STEPD_SOCKET_TAIL > _SOCKET_PATH_MAX

    @property
    def run_spool_root(self) -> Path:
        """The spool dirs' parent when :attr:`spool_in_run`: one per cluster (its state
        dir's digest, as :attr:`munge_dir`)."""
        return SPOOL_RUN_DIR / hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]

    def tmpfs_dir(self, node: str) -> Path:
        return self.state_dir / "tmp" / node

    def gpu_dir(self, node: str) -> Path:
        return self.state_dir / "dev" / node

    def pid_file(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    @property
    def login_dir(self) -> Path:
        """Reserved for weaved's state: login side only, masked on separate hosts."""
        return self.state_dir / "login"

    @property
    def shared_root(self) -> Path:
        """The cluster's shared file system (as over NFS): the same on every host."""
        return self.state_dir / "shared"

    @property
    def shared(self) -> SharedPaths:
        r = self.shared_root
        return SharedPaths(home=r / "home", work=r / "work", ckpt=r / "ckpt")

    @property
    def site_dir(self) -> Path:
        """Site software and files every host sees read-only (hosts file, SPANK .so)."""
        return self.state_dir / "site"

    @property
    def conf_files(self) -> tuple[Path, ...]:
        """The Slurm config files every host reads (read-only on separate hosts)."""
        return (self.slurm_conf, self.gres_conf, self.plugstack_conf, self.oci_conf)

    def host_dir(self, node: str) -> Path:
        """A separate host's own disk (spool, logs, GPU files): seen by it and the login."""
        return self.state_dir / "hosts" / node

    def node_gpu_dir(self, node: str, mode: HostMode) -> Path:
        return self.host_dir(node) / "dev" if mode is HostMode.SEPARATE else self.gpu_dir(node)

    def node_spool_dir(self, node: str, mode: HostMode) -> Path:
        if self.spool_in_run:
            return self.run_spool_root / node
        return (self.host_dir(node) / "spool" if mode is HostMode.SEPARATE
                else self.spool_dir(node))


@dataclass(frozen=True)
class SharedPaths:
    """The shared file systems of the cluster: users' homes, work dirs, checkpoints."""

    home: Path
    work: Path
    ckpt: Path

    def all(self) -> tuple[Path, ...]:
        return (self.home, self.work, self.ckpt)

    def to_json(self) -> dict[str, str]:
        return {"home": str(self.home), "work": str(self.work), "ckpt": str(self.ckpt)}


@dataclass(frozen=True)
class HostAddressing:
    """How separate hosts are reached: the login's name and address, each node's address.

    Each node's hostname is its node name; every slurmd listens on :data:`SLURMD_PORT`.
    """

    login_name: str
    login_addr: str
    nodes: tuple[tuple[str, str], ...]

    def addr(self, node: str) -> str:
        return dict(self.nodes)[node]


@dataclass(frozen=True)
class ClusterPorts:
    """The TCP ports of slurmctld and of each slurmd (unique per node)."""

    slurmctld: int
    slurmd: tuple[tuple[str, int], ...]

    def for_node(self, node: str) -> int:
        return dict(self.slurmd)[node]


def render_slurm_conf(layout: ClusterLayout, paths: ClusterPaths, ports: ClusterPorts,
                      munge_socket: Path | None, hosts: HostAddressing | None = None) -> str:
    """``slurm.conf`` for the local cluster; ``munge_socket`` None = the system munged.

    ``hosts`` None renders the shared-host layout (loopback, a port per node);
    else every node is a host of its own, reached at its address on SLURMD_PORT.
    """
    ctld = f"{hosts.login_name}({hosts.login_addr})" if hosts else "localhost"
    lines = [
        "# Generated by weave-slurm (weave cluster up); edits are overwritten.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={ctld}",
        f"SlurmctldPort={ports.slurmctld}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
    ]
    if munge_socket is not None:
        lines.append(f"AuthInfo=socket={munge_socket}")
    lines += [
        f"StateSaveLocation={paths.ctld_state_dir}",
        *(_separate_host_dirs(paths) if hosts else _shared_host_dirs(paths)),
        f"SlurmctldPidFile={paths.run_dir}/slurmctld.pid.ctl",
        f"SlurmctldLogFile={paths.log_dir}/slurmctld.log",
        f"PlugStackConfig={paths.plugstack_conf}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MailProg=/bin/true",
        "MpiDefault=none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "GresTypes=gpu",
        "KillWait=5",
        "MinJobAge=30",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
    ]
    for pool in layout.pools:
        for name in pool.node_names():
            where = (f"NodeHostname={name} NodeAddr={hosts.addr(name)}" if hosts else
                     f"NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports.for_node(name)}")
            lines.append(
                f"NodeName={name} {where} CPUs={pool.cpus_per_node} "
                f"RealMemory={pool.real_memory_mib} "
                f"Gres=gpu:{pool.gpu_type}:{pool.gpus_per_node} State=UNKNOWN")
    for i, pool in enumerate(layout.pools):
        default = "YES" if i == 0 else "NO"
        lines.append(f"PartitionName={pool.partition} Nodes={','.join(pool.node_names())} "
                     f"Default={default} MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


def _shared_host_dirs(paths: ClusterPaths) -> list[str]:
    s = paths.state_dir
    spool = paths.run_spool_root if paths.spool_in_run else s / "spool"
    return [f"SlurmdSpoolDir={spool}/%n", f"TmpFS={s}/tmp/%n",
            f"SlurmdPidFile={paths.run_dir}/slurmd-%n.pid.ctl",
            f"SlurmdLogFile={paths.log_dir}/slurmd-%n.log"]


def _separate_host_dirs(paths: ClusterPaths) -> list[str]:
    """Each host's slurmd keeps its files on its own disk (its spool in its own /run when
    the state dir is too long for slurmstepd's sockets); TmpFS is its private /tmp."""
    s = paths.state_dir
    spool = f"{paths.run_spool_root}/%n" if paths.spool_in_run else f"{s}/hosts/%n/spool"
    return [f"SlurmdPort={SLURMD_PORT}", f"SlurmdSpoolDir={spool}", "TmpFS=/tmp",
            f"SlurmdPidFile={s}/hosts/%n/slurmd.pid", f"SlurmdLogFile={s}/hosts/%n/slurmd.log"]


def render_gres_conf(layout: ClusterLayout, paths: ClusterPaths,
                     mode: HostMode = HostMode.SHARED) -> str:
    """``gres.conf``: typed GPUs per node whose device files are /dev/null symlinks."""
    lines = ["# Generated by weave-slurm (weave cluster up).", "AutoDetect=off"]
    for pool in layout.pools:
        for name in pool.node_names():
            last = pool.gpus_per_node - 1
            gpu_dir = paths.node_gpu_dir(name, mode)
            files = f"{gpu_dir}/nvidia[0-{last}]" if last > 0 else f"{gpu_dir}/nvidia0"
            lines.append(f"NodeName={name} Name=gpu Type={pool.gpu_type} File={files}")
    return "\n".join(lines) + "\n"


def render_plugstack_conf(spank_plugin: Path | None, socket_dir: Path | None) -> str:
    """``plugstack.conf``: the weave SPANK plugin (optional: a missing .so is no error)."""
    lines = ["# Generated by weave-slurm (weave cluster up)."]
    if spank_plugin is not None:
        arg = f" sockdir={socket_dir}" if socket_dir is not None else ""
        lines.append(f"optional {spank_plugin}{arg}")
    return "\n".join(lines) + "\n"


#: Each host's own state dir of the OCI runtime (its /run is private on separate hosts).
OCI_STATE_DIR = "/run/weave-oci"


def render_oci_conf(runtime: str | None) -> str:
    """``oci.conf`` for Slurm's OCI support (``srun --container=BUNDLE``) with ``runtime``
    (``runc`` or ``crun``, run as root by slurmstepd), or a file that configures none.
    The container's name is unique per task (node, user, job, step, task), as in
    Slurm's own examples; weave's node daemon reads the same file (node/containers.py)."""
    lines = ["# Generated by weave-slurm (weave cluster up); edits are overwritten."]
    if runtime is None:
        lines.append("# no OCI runtime (runc, crun) was installed: none configured")
        return "\n".join(lines) + "\n"
    rt, name = f"{runtime} --root={OCI_STATE_DIR}", "%n.%u.%j.%s.%t"
    lines += [f'RunTimeQuery="{rt} state {name}"',
              f'RunTimeKill="{rt} kill {name} SIGTERM"',
              f'RunTimeDelete="{rt} delete --force {name}"',
              f'RunTimeRun="{rt} run --bundle %b {name}"']
    return "\n".join(lines) + "\n"
