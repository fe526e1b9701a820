"""Where weaved's node daemons live and how weaved reaches them.

One node daemon runs on each node of a group's allocation (a step of it). On the
local backend weaved shares the host with every "node" and reaches each daemon at a
Unix socket in its state directory. On Slurm a node is a host of its own: weaved
reaches its daemon over TCP at the node's address (Slurm's ``NodeAddr``) and the port
the daemon got (any free one) and said in its ready line, which comes back to weaved's
host in the step's output; weaved reads the newest one per node each time it
connects, so a relaunched daemon is found again and daemons of other instances or
earlier steps never collide. Every message is munge-authenticated
(:mod:`weave_slurm.node.remote`). Everything a node daemon
keeps is node-local (its store under ``shm_root``, its socket for local clients under
``node_socket_dir``), per weaved instance, except the checkpoints: those go under
``checkpoint_root``, which must be a file system weaved and every node share (a
lost node's checkpoints are re-admitted elsewhere from there).

**Shares.** An allocation that holds some of a node's GPUs (a share,
:func:`~weave_slurm.daemon.allocplan.is_share`) may sit beside another group's share
on the same node, each with its own node daemon. A share's daemon keeps its node-local
state apart, keyed by its allocation (Slurm's job id, ``<key>`` = ``<node>.<job id>``):
its store ``<shm_root>/[<instance>/]<key>`` and its socket ``<socket dir>/node-<key>.sock``
(where the SPANK plugin points the allocation's own tasks), with a budget of the node's
``host_mem_gib`` in proportion to its GPUs. Its checkpoints stay the node's
(``<checkpoint_root>/[<instance>/]<node>``, where a lost node's are looked for): they are
kept per job inside, and the two shares hold different jobs. Releasing one share ends
its daemon, which removes its own store, and touches nothing of the other's. Each
share's daemon is a step of its allocation, so Slurm gives it its share's GPUs
(``CUDA_VISIBLE_DEVICES``), which the workers it starts inherit (node/job_env.py). A
whole-node allocation keeps the per-node names (``<node>``). The key is also the node's
name in its group's runtime (:meth:`NodeDaemons.ref`: ``NodeRef.name``, the host in
``NodeRef.host``), so one group may hold two shares of one node.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from weave_slurm.config.site import PoolConfig, SiteConfig
from weave_slurm.daemon import allocplan, membership
from weave_slurm.daemon.reconcile import NODE_STEP
from weave_slurm.daemon.records import AllocRow, GroupRow
from weave_slurm.errors import NodeUnavailable, StateError, WeaveError
from weave_slurm.node.remote import ready_ports
from weave_slurm.runtime.group import NodeRef
from weave_slurm.slurm.backend import Backend, StepSpec
from weave_slurm.slurm.command_runner import PipedProcess
from weave_slurm.vocab import Pool

#: The node-local socket directory the weave SPANK plugin points job tasks at.
SPANK_SOCKET_DIR = Path("/run/weave")
#: How often a local-backend node daemon reads whether its allocation is still held
#: (a node daemon whose allocation was released, or whose state dir is gone, ends).
LOCAL_WATCH_S = 2.0


@dataclass(frozen=True)
class NodeDaemonSettings:
    """What weaved's config says about its node daemons (see module doc)."""

    state_dir: Path
    instance: str = ""
    remote: bool = False                     # nodes are other hosts (TCP + munge)
    node_command: tuple[str, ...] | None = None
    node_socket_dir: Path | None = None      # default: <state>/nodes (local), /run/weave
    shm_root: Path = Path("/dev/shm/weave-nodes")
    checkpoint_root: Path | None = None      # default: <state>/ckpt (one host only)
    munge_socket: str | None = None
    python: str = sys.executable             # the interpreter the nodes run weave with


class NodeDaemons:
    """The node daemons of weaved's allocations: their step, their address, their roots."""

    def __init__(self, settings: NodeDaemonSettings, site: SiteConfig, backend: Backend) -> None:
        self.s, self.site, self.backend = settings, site, backend
        self._addresses: dict[str, str] = {}
        self._logs: dict[tuple[str | None, str], Path] = {}   # (alloc id, node) -> its log

    # -- paths (per instance) --------------------------------------------------------
    def _instanced(self, base: Path) -> Path:
        return base / self.s.instance if self.s.instance else base

    @property
    def socket_dir(self) -> Path:
        if self.s.node_socket_dir is not None:
            return self._instanced(self.s.node_socket_dir)
        if self.s.remote:
            return self._instanced(SPANK_SOCKET_DIR)
        return self.s.state_dir.resolve() / "nodes"

    @property
    def checkpoint_base(self) -> Path | None:
        """Where each node keeps its checkpoints (``<base>/<node>``), when weaved knows it
        (a site's own node command: unknown)."""
        if self.s.node_command is not None:
            return None
        if self.s.checkpoint_root is not None:
            return self._instanced(self.s.checkpoint_root.resolve())
        return self.s.state_dir.resolve() / "ckpt"

    def log_path(self, alloc: AllocRow) -> Path:
        """The node-daemon step's output on weaved's host (the ready lines are there)."""
        label = membership.group_label(self.s.instance, alloc.group_id)
        return self.s.state_dir.resolve() / "logs" / f"node-{label}-{alloc.pool}.log"

    # -- how weaved reaches a node daemon --------------------------------------------
    def ref(self, alloc: AllocRow, node: str, pool: Pool) -> NodeRef:
        """``node``'s daemon, named by its key (a share's: ``<node>.<job id>``, module
        doc) on host ``node``; on Slurm its address and the port it said it got
        (``NodeUnavailable`` until it said so)."""
        key = self.node_key(alloc, node)
        host = None if key == node else node
        socket, log = self.socket_dir / f"node-{key}.sock", self.log_path(alloc)
        if not self.s.remote:   # started by weaved's node-daemon step (``step``)
            return NodeRef(key, pool, socket, step_log=log, host=host)
        self._logs[(alloc.alloc_id, key)] = log
        return NodeRef(key, pool, socket, self.address(node), self._port(log, node),
                       alloc.alloc_id, step_log=log, host=host)

    def resolve(self, node: NodeRef) -> NodeRef:
        """``node`` with the port its daemon said last (a relaunched daemon's new one)."""
        log = self._logs.get((node.alloc_id, node.name))
        if not node.remote or log is None:
            return node
        return replace(node, port=self._port(log, node.slurm_host))

    @staticmethod
    def _port(log: Path, node: str) -> int:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
        port = ready_ports(text).get(node)
        if port is None:
            raise NodeUnavailable(f"the node daemon on {node} has not said its port yet "
                                  f"(see {log})")
        return port


    def address(self, node: str) -> str:
        """The node's address as Slurm knows it (``NodeAddr``)."""
        if node not in self._addresses:
            try:
                self._addresses.update({n.name: n.address or n.name
                                        for n in self.backend.nodes()})
            except WeaveError as exc:
                raise StateError(f"cannot read node {node}'s address from Slurm: "
                                 f"{exc}") from exc
        if node not in self._addresses:
            raise StateError(f"Slurm reports no node {node!r} (sinfo)")
        return self._addresses[node]

    def launch_agent(self, node: NodeRef, spec: StepSpec) -> PipedProcess:
        """A node's sync agent: a piped one-task step of the node's allocation."""
        if node.alloc_id is None:
            raise StateError(f"node {node.name}: no allocation to run its sync agent in")
        return self.backend.open_step(node.alloc_id, spec)

    # -- the node-daemon step ----------------------------------------------------------
    def _pool(self, alloc: AllocRow) -> PoolConfig:
        return self.site.rollout if alloc.role == "rollout" else self.site.train

    def share(self, alloc: AllocRow) -> bool:
        """``alloc`` holds some of its nodes' GPUs, not all (module doc, "Shares")."""
        return allocplan.is_share(alloc, self._pool(alloc).gpus_per_node)

    def node_key(self, alloc: AllocRow, node: str) -> str:
        """What ``alloc``'s daemon on ``node`` keys its store and socket by:
        the node, and for a share its Slurm job id too (module doc)."""
        return allocplan.node_key(alloc, node, self._pool(alloc).gpus_per_node)

    def budget_gib(self, alloc: AllocRow) -> float:
        """The warm state its node daemons may keep: the node's ``host_mem_gib``, in
        proportion to a share's GPUs."""
        pool = self._pool(alloc)
        if not self.share(alloc):
            return pool.host_mem_gib
        return pool.host_mem_gib * alloc.gpus_per_node / pool.gpus_per_node

    def command(self, alloc: AllocRow) -> tuple[str, ...]:
        """The node daemon's argv (no shell: ``weave node serve`` expands ``{node}`` from
        ``SLURMD_NODENAME`` and takes its socket from ``WEAVE_NODE_SOCKET``)."""
        if self.s.node_command is not None:
            return self.s.node_command
        base = self.checkpoint_base
        assert base is not None
        key = self.node_key(alloc, "{node}")
        argv = [self.s.python, "-m", "weave_slurm.cli.node", "serve",
                "--host-mem-gib", f"{self.budget_gib(alloc):g}",
                "--root", f"{self._instanced(self.s.shm_root)}/{key}",
                "--socket", f"{self.socket_dir}/node-{key}.sock",
                "--checkpoint-interval-s", "0", "--checkpoint-root", f"{base}/{{node}}"]
        if self.s.remote:   # its allocation watch: every 30 s or $WEAVE_NODE_ALLOCATION_WATCH_S
            argv += ["--listen-port", "0", "--trusted-uid", str(os.getuid())]
            if self.s.munge_socket:
                argv += ["--munge-socket", self.s.munge_socket]
        else:   # the local backend's: its state file is read, not Slurm (cheap: often)
            argv += ["--allocation-watch-s", f"{LOCAL_WATCH_S:g}"]
        return tuple(argv)

    def step(self, group: GroupRow, alloc: AllocRow) -> StepSpec:
        """The node-daemon step of an allocation, one task per node: a plain argv (no
        shell; ``weave node serve`` expands ``{node}`` itself) and, for a site's own
        node command, the group, pool, budget and socket directory in its environment."""
        env = {"WEAVE_GROUP": group.label, "WEAVE_POOL": alloc.pool,
               "WEAVE_SHM_BUDGET_GIB": f"{self.budget_gib(alloc):g}",
               "WEAVE_NODE_SOCKET_DIR": str(self.socket_dir)}
        return StepSpec(name=NODE_STEP, argv=self.command(alloc), ntasks=alloc.held_count,
                        node_count=alloc.held_count, env=env, log_path=self.log_path(alloc))
