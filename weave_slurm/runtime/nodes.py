"""weaved's connections to one group's node daemons (the runner's one door to them).

Every request the group runner makes of a node goes through :meth:`NodeLink.call`. A
node daemon that does not answer raises :class:`~weave_slurm.errors.NodeGone` (the
connection is dropped and made again on the next call); what a daemon refuses raises
the error it names. Callers turn either into a typed fault
(:meth:`~weave_slurm.runtime.faults.Fault.from_error`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weave_slurm.errors import NodeGone, WeaveError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import NodeRef

log = logging.getLogger(__name__)

ClientFactory = Callable[[Path], Any]


class NodeLink:
    """One client per node daemon of a group, made on first use."""

    def __init__(self, client_factory: ClientFactory | None = None) -> None:
        self._factory = client_factory
        self._clients: dict[Path, Any] = {}

    def client(self, socket_path: Path) -> Any:
        """The connection to the node daemon at ``socket_path`` (the transfer's door)."""
        if socket_path not in self._clients:
            if self._factory is not None:
                self._clients[socket_path] = self._factory(socket_path)
            else:
                from weave_slurm.node.client import NodeClient

                self._clients[socket_path] = NodeClient(socket_path)
        return self._clients[socket_path]

    def call(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any]:
        """One request to ``node``'s daemon; ``NodeGone`` when it does not answer."""
        try:
            return dict(self.client(node.socket_path).call(op, **args))
        except NodeGone:
            old = self._clients.pop(node.socket_path, None)   # reconnect next time
            if old is not None:
                old.close()
            raise

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
