"""Node daemons for a group, launched as steps through the Slurm backend.

One ``weave node serve`` per node of the group, each a one-task step pinned to its
node (``srun --jobid --overlap -w <node>`` on Slurm; a plain process per virtual node
on the LocalBackend). On one host the virtual nodes get separate store roots
(``<shm_dir>/<node>``) and checkpoint roots, so each behaves as its own node.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.processes import node_status
from tests.harness.scratch import shm_dir
from tests.harness.waits import wait_for
from weave_slurm.errors import WeaveError
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.slurm.backend import (
    Allocation,
    AllocationRequest,
    Backend,
    ResourceSpec,
    StepHandle,
    StepSpec,
)
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetConfig:
    group_id: str
    shm_dir: Path                    # e.g. /dev/shm/weave-demo-XXXX
    state_dir: Path                  # checkpoints and daemon logs
    rollout_nodes: int = 1
    train_nodes: int = 1
    rollout_partition: str = "h20"
    train_partition: str = "h800"
    host_mem_gib: float = 0.5
    start_timeout_s: float = 60.0
    # remote mode: each daemon also listens on 127.0.0.1 (munge-authenticated, as on
    # another host) and its NodeRef carries that address, so the runner uses the
    # network paths (TCP control, agents for data) although all runs on one host
    munge_socket: str | None = None


@dataclass
class NodeFleet:
    """The allocations and node-daemon steps of one group."""

    backend: Backend
    config: FleetConfig
    allocations: dict[Pool, Allocation] = field(default_factory=dict)
    steps: dict[str, tuple[Allocation, StepHandle]] = field(default_factory=dict)
    layout: GroupLayout | None = None
    ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> GroupLayout:
        cfg = self.config
        refs: dict[Pool, list[NodeRef]] = {Pool.ROLLOUT: [], Pool.TRAIN: []}
        for pool, partition, count in ((Pool.ROLLOUT, cfg.rollout_partition, cfg.rollout_nodes),
                                       (Pool.TRAIN, cfg.train_partition, cfg.train_nodes)):
            alloc = self.backend.allocate(AllocationRequest(
                cfg.group_id, pool.value, (ResourceSpec(partition, count, cpus_per_node=1),)))
            self.allocations[pool] = alloc
            for node in alloc.nodes:
                refs[pool].append(self._launch(alloc, pool, node))
        self.layout = GroupLayout(tuple(refs[Pool.ROLLOUT]), tuple(refs[Pool.TRAIN]))
        for ref in (*self.layout.rollout, *self.layout.train):
            self.wait_ready(ref)
        return self.layout

    def root(self, node: str) -> Path:
        return self.config.shm_dir / node / "weave"

    def _launch(self, alloc: Allocation, pool: Pool, node: str) -> NodeRef:
        cfg = self.config
        root = self.root(node)
        root.parent.mkdir(parents=True, exist_ok=True)
        root.parent.chmod(0o711)
        argv: tuple[str, ...] = (
            sys.executable, "-m", "weave_slurm.cli", "node", "serve",
            "--host-mem-gib", str(cfg.host_mem_gib), "--root", str(root),
            "--checkpoint-root", str(cfg.state_dir / "ckpt" / node),
            "--checkpoint-interval-s", "0")
        port = None
        if cfg.munge_socket is not None:
            port = self.ports.setdefault(node, free_port())
            argv += ("--listen-port", str(port), "--listen-host", "127.0.0.1",
                     "--trusted-uid", str(os.getuid()), "--munge-socket", cfg.munge_socket)
        name = f"weave-node-{node}"
        handle = self.backend.launch_step(alloc.alloc_id, StepSpec(
            name=name, argv=argv, ntasks=1, node_count=1, nodelist=(node,),
            log_path=cfg.state_dir / "logs" / f"{name}.log"))
        self.steps[node] = (alloc, handle)
        if port is None:
            return NodeRef(node, pool, root / "node.sock")
        return NodeRef(node, pool, root / "node.sock", "127.0.0.1", port, alloc.alloc_id)

    def wait_ready(self, ref: NodeRef) -> None:
        wait_for(lambda: node_status(ref.socket_path), self.config.start_timeout_s,
                 f"the node daemon of {ref.name} answering on {ref.socket_path} (see "
                 f"{self.config.state_dir / 'logs'})", interval_s=0.1,
                 ignore=(WeaveError, OSError))

    def restart(self, node: str) -> None:
        """Start a node's daemon again (after it died); it re-adopts its shm state."""
        alloc, handle = self.steps[node]
        try:
            self.backend.cancel_step(handle)
        except WeaveError as exc:
            log.info("cancel of the old daemon step on %s: %s", node, exc)
        pool = Pool.ROLLOUT if alloc is self.allocations[Pool.ROLLOUT] else Pool.TRAIN
        self.wait_ready(self._launch(alloc, pool, node))

    def stop(self, remove_state: bool = True) -> None:
        for _alloc, handle in self.steps.values():
            try:
                self.backend.cancel_step(handle)
            except WeaveError as exc:
                log.info("cancel of %s: %s", handle.name, exc)
        for alloc in self.allocations.values():
            try:
                self.backend.release(alloc.alloc_id)
            except WeaveError as exc:
                log.info("release of %s: %s", alloc.alloc_id, exc)
        self.steps.clear()
        self.allocations.clear()
        if remove_state:
            shutil.rmtree(self.config.shm_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_fleet(state_dir: Path, group_id: str, shm_prefix: str,
                rollout_nodes: int = 1, munge_socket: str | None = None,
                train_nodes: int = 1) -> Iterator[NodeFleet]:
    """A started fleet of one group on a LocalBackend in ``state_dir`` (its node
    daemons are local processes), its shm in ``/dev/shm/<shm_prefix>XXXX``; stopped and
    removed at the end. Host memory 0.25 GiB a node: the toy's warm state is small."""
    from weave_slurm.slurm.local_backend import LocalBackend

    with shm_dir(shm_prefix) as shm:
        fleet = NodeFleet(LocalBackend(state_dir / "backend"),
                          FleetConfig(group_id, shm, state_dir, rollout_nodes=rollout_nodes,
                                      train_nodes=train_nodes, host_mem_gib=0.25,
                                      munge_socket=munge_socket))
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()
