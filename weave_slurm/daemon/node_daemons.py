"""Where weaved's node daemons live and how weaved reaches them.

One node daemon runs on each node of a group's allocation (a step of it). On the
local backend weaved shares the host with every "node" and reaches each daemon at a
Unix socket in its state directory. On Slurm a node is a host of its own: weaved
reaches its daemon over TCP at the node's address (Slurm's ``NodeAddr``) and a port
derived from the allocation (``node_port_base + allocation key % node_port_span``: the
same after a weaved restart, distinct between this weaved's allocations), every
message munge-authenticated (:mod:`weave_slurm.node.remote`). Everything a node daemon
keeps is node-local (its store under ``shm_root``, its socket for local clients under
``node_socket_dir``), per weaved instance, except the checkpoints: those go under
``checkpoint_root``, which must be a file system weaved and every node share (a
lost node's checkpoints are re-admitted elsewhere from there).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon.reconcile import NODE_STEP
from weave_slurm.daemon.records import AllocRow, GroupRow
from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.runtime.group import NodeRef
from weave_slurm.slurm.backend import Backend, StepSpec
from weave_slurm.slurm.runner import PipedProcess
from weave_slurm.slurm.templates import render_node_daemon
from weave_slurm.vocab import Pool

#: The node-local socket directory the weave SPANK plugin points job tasks at.
SPANK_SOCKET_DIR = Path("/run/weave")


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
    node_port_base: int = 47000
    node_port_span: int = 1000
    munge_socket: str | None = None
    python: str = sys.executable             # the interpreter the nodes run weave with

    def validate(self) -> None:
        if not 1024 <= self.node_port_base <= 65535 - self.node_port_span \
                or self.node_port_span < 1:
            raise ConfigError(f"--node-port-base {self.node_port_base} / span "
                              f"{self.node_port_span}: the ports must lie in 1024..65535")


class NodeDaemons:
    """The node daemons of weaved's allocations: their step, their address, their roots."""

    def __init__(self, settings: NodeDaemonSettings, site: SiteConfig, backend: Backend) -> None:
        settings.validate()
        self.s, self.site, self.backend = settings, site, backend
        self._addresses: dict[str, str] = {}

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

    def port(self, alloc: AllocRow) -> int:
        return self.s.node_port_base + alloc.key % self.s.node_port_span

    # -- how weaved reaches a node daemon --------------------------------------------
    def ref(self, alloc: AllocRow, node: str, pool: Pool) -> NodeRef:
        socket = self.socket_dir / f"node-{node}.sock"
        if not self.s.remote:
            return NodeRef(node, pool, socket)
        return NodeRef(node, pool, socket, self.address(node), self.port(alloc), alloc.alloc_id)

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
        return self.backend.open_step(node.alloc_id, replace(spec, argv=(
            self.s.python, *spec.argv[1:])))

    # -- the node-daemon step ----------------------------------------------------------
    def command(self, alloc: AllocRow) -> tuple[str, ...]:
        """The node daemon's argv (no shell: ``weave node serve`` expands ``{node}`` from
        ``SLURMD_NODENAME`` and takes its socket from ``WEAVE_NODE_SOCKET``)."""
        if self.s.node_command is not None:
            return self.s.node_command
        pool = self.site.rollout if alloc.role == "rollout" else self.site.train
        base = self.checkpoint_base
        assert base is not None
        argv = [self.s.python, "-m", "weave_slurm.cli.node", "serve",
                "--host-mem-gib", f"{pool.host_mem_gib:g}",
                "--root", f"{self._instanced(self.s.shm_root)}/{{node}}",
                "--checkpoint-interval-s", "0", "--checkpoint-root", f"{base}/{{node}}"]
        if self.s.remote:
            argv += ["--listen-port", str(self.port(alloc)), "--trusted-uid", str(os.getuid())]
            if self.s.munge_socket:
                argv += ["--munge-socket", self.s.munge_socket]
        return tuple(argv)

    def step(self, group: GroupRow, alloc: AllocRow) -> StepSpec:
        """The node-daemon step of an allocation, one task per node: the rendered
        template, carried inline (a node does not see weaved's state directory)."""
        pool = self.site.rollout if alloc.role == "rollout" else self.site.train
        script = render_node_daemon(group.label, alloc.pool, self.socket_dir,
                                    self.command(alloc), pool.host_mem_gib)
        logs = self.s.state_dir.resolve() / "logs"
        return StepSpec(name=NODE_STEP, argv=("bash", "-c", script, "weave-node"),
                        ntasks=alloc.node_count, node_count=alloc.node_count,
                        log_path=logs / f"node-{group.label}-{alloc.pool}.log")
