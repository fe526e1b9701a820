"""weaved's connections to one group's node daemons (the runner's one door to them).

Every request the group runner makes of a node goes through :meth:`NodeLink.call`. A
node daemon that does not answer raises :class:`~weave_slurm.errors.NodeGone` (the
connection is dropped and made again on the next call); what a daemon refuses raises
the error it names. Callers turn either into a typed fault
(:meth:`~weave_slurm.runtime.faults.Fault.from_error`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weave_slurm.errors import NodeGone, WeaveError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import NodeRef

log = logging.getLogger(__name__)

ClientFactory = Callable[[Path], Any]
#: How long a remote node daemon that did not answer is left alone.
RETRY_AFTER_S = 5.0
#: A node's current address and port (its daemon may have been relaunched elsewhere).
Resolver = Callable[[NodeRef], NodeRef]


def _key(node: NodeRef) -> object:
    return ("remote", node.alloc_id, node.name) if node.remote else node.socket_path


class NodeLink:
    """One client per node daemon of a group, made on first use: remote (TCP, munge)
    for a node with an address, local (its Unix socket) otherwise."""

    def __init__(self, client_factory: ClientFactory | None = None,
                 munge_socket: str | None = None,
                 resolve: Resolver | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._factory = client_factory
        self._munge_socket = munge_socket
        self._resolve = resolve
        self._now = now
        self._clients: dict[object, Any] = {}
        self._down: dict[object, tuple[float, str]] = {}   # key -> (retry after, why)

    def local(self, socket_path: Path, step_log: Path | None = None) -> Any:
        """The connection to the node daemon at ``socket_path`` on this host (the shm
        handoff's door: it writes into that node's shared memory directly);
        ``step_log``: :attr:`NodeRef.step_log`."""
        if socket_path not in self._clients:
            if self._factory is not None:
                self._clients[socket_path] = self._factory(socket_path)
            else:
                from weave_slurm.node.node_client import NodeClient

                self._clients[socket_path] = NodeClient(socket_path, step_log=step_log)
        return self._clients[socket_path]

    def client(self, node: NodeRef) -> Any:
        """The control connection to ``node``'s daemon."""
        if not node.remote:
            return self.local(node.socket_path, node.step_log)
        key = _key(node)
        if key not in self._clients:   # where it listens now (a relaunched daemon moves)
            fresh = self._resolve(node) if self._resolve is not None else node
            self._clients[key] = connect(fresh, munge_socket=self._munge_socket)
        return self._clients[key]

    def call(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any]:
        """One request to ``node``'s daemon; ``NodeGone`` when it does not answer.

        A remote daemon that just did not answer is not asked again for
        :data:`RETRY_AFTER_S`: every request meanwhile fails at once, so a host cut off
        the network costs one timeout, not one per member and tick."""
        key = _key(node)
        down = self._down.get(key)
        if down is not None and self._now() < down[0]:
            raise NodeGone(f"node {node.name} is unreachable (retried in "
                           f"{down[0] - self._now():.0f} s): {down[1]}", node=node.name)
        try:
            reply = dict(self.client(node).call(op, **args))
        except NodeGone as exc:
            old = self._clients.pop(key, None)   # reconnect next time
            if old is not None:
                old.close()
            if node.remote:
                self._down[key] = (self._now() + RETRY_AFTER_S, str(exc))
            if exc.node is None:
                exc.node = node.name
            raise
        self._down.pop(key, None)
        return reply

    def best_effort(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any] | None:
        """A request whose failure changes nothing (stopping or dropping what may be
        gone already): None when it failed, which is logged."""
        try:
            return self.call(node, op, **args)
        except (WeaveError, OSError) as exc:
            log.info("%s of %s on %s: %s", op.value, args.get("job"), node.name, exc)
            return None

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def connect(node: NodeRef, timeout_s: float = 120.0, munge_socket: str | None = None) -> Any:
    """A new connection to ``node``'s daemon (the caller closes it)."""
    if node.remote:
        from weave_slurm.node.auth import Munge
        from weave_slurm.node.remote import RemoteNodeClient

        assert node.address is not None and node.port is not None
        return RemoteNodeClient(node.address, node.port, Munge(munge_socket), timeout_s)
    from weave_slurm.node.node_client import NodeClient

    return NodeClient(node.socket_path, timeout_s, step_log=node.step_log)
