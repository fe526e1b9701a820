"""GPU shares of one node for the tests (daemon/node_daemons.py, "Shares"): rollout
allocations of some of a node's GPUs, asked as weaved asks them (the row shape of
daemon/allocplan.py, the request of daemon/allocations.py), each with its node daemon
launched as weaved launches it (a step of its allocation)."""

from __future__ import annotations

from functools import partial
from typing import Any

from tests.harness.waits import wait_for
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.allocations import alloc_request
from weave_slurm.daemon.node_daemons import NodeDaemons
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow
from weave_slurm.daemon.states import AllocState, GroupState
from weave_slurm.errors import NodeGone, NodeUnavailable
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import NodeRef
from weave_slurm.runtime.nodes import connect
from weave_slurm.slurm.backend import Backend
from weave_slurm.vocab import Pool

#: What weaved asks per whole node (``weave daemon --cpus-per-node``, its default).
CPUS = 2


def share_daemons(backend: Backend, nodes: NodeDaemons, gpus: int, rows: list[AllocRow],
                  groups: tuple[int, ...] = (1, 2)) -> None:
    """One rollout share of ``gpus`` GPUs per group, held, each with its node daemon
    launched; each row is appended to ``rows`` once held (so that the caller's
    ``finally`` releases what was held even when a later one fails)."""
    shape = allocplan.row_shape(nodes.site.rollout.gpus_per_node, CPUS, gpus)
    for gid in groups:
        group = GroupRow(gid, str(gid), GroupState.FORMING, GroupPlan(1, 0, ()), 0.0, "")
        row = AllocRow(gid, gid, "rollout", "h20-0", "h20", 1, shape.gpus_per_node, "h20",
                       shape.cpus_per_node, AllocState.ALLOCATING, None, (), "")
        got = backend.allocate(alloc_request(group, row, 30, "default"))
        row = AllocRow(gid, gid, "rollout", "h20-0", "h20", 1, shape.gpus_per_node, "h20",
                       shape.cpus_per_node, AllocState.HELD, got.alloc_id, got.nodes, "")
        rows.append(row)
        backend.launch_step(got.alloc_id, nodes.step(group, row))


def status(ref: NodeRef, munge: str | None = None) -> dict[str, Any]:
    with connect(ref, 10.0, munge) as client:
        return dict(client.call(Op.STATUS))


def answering(nodes: NodeDaemons, rows: list[AllocRow], node: str,
              munge: str | None = None) -> tuple[list[NodeRef], list[dict[str, Any]]]:
    """Each share's daemon on ``node`` once it answers, and its first status."""
    refs = [wait_for(partial(nodes.ref, r, node, Pool.ROLLOUT), 90, "the node daemon's port",
                     ignore=(NodeUnavailable,)) for r in rows]
    return refs, [wait_for(partial(status, ref, munge), 60, "the node daemon to answer",
                           ignore=(NodeGone, FileNotFoundError, ConnectionError))
                  for ref in refs]


def gone(ref: NodeRef, munge: str | None = None) -> bool:
    """``ref``'s daemon no longer answers."""
    try:
        status(ref, munge)
    except (NodeGone, OSError):
        return True
    return False
