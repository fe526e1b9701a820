"""Whether a group's node daemons answer: one connect-and-ping each, before weaved
builds a group's runtime on them or extends it to new nodes; and telling the daemons of
nodes weaved gives back to Slurm to end (:func:`tell_to_leave`).

A daemon that does not answer yet is not an error here: the error is returned as a
value, and its type says why (:func:`~weave_slurm.daemon.waits.answer_cause`: munge
failing is AUTH, anything else a node still starting), so the group waits by the
right deadline and the next reconcile tick asks again.
"""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.errors import WeaveError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import NodeRef
from weave_slurm.runtime.nodes import connect


def answers(ref: NodeRef, timeout_s: float, munge_socket: str | None) -> Exception | None:
    """None when ``ref``'s daemon answers a STATUS within ``timeout_s``; else the error."""
    return _ask(ref, Op.STATUS, timeout_s, munge_socket)


def _ask(ref: NodeRef, op: Op, timeout_s: float, munge_socket: str | None) -> Exception | None:
    """One ``op`` to ``ref``'s daemon on a connection of its own: None when it answered,
    else the error."""
    try:
        client = connect(ref, timeout_s, munge_socket)
    except (WeaveError, OSError) as exc:
        return exc
    try:
        client.call(op)
    except (WeaveError, OSError) as exc:
        return exc
    finally:
        client.close()
    return None


def first_silent(refs: Sequence[NodeRef], timeout_s: float,
                 munge_socket: str | None) -> tuple[NodeRef, Exception] | None:
    """The first of ``refs`` whose daemon does not answer, with its error (None: all do)."""
    for ref in refs:
        error = answers(ref, timeout_s, munge_socket)
        if error is not None:
            return ref, error
    return None


def tell_to_leave(refs: Sequence[NodeRef], timeout_s: float,
                  munge_socket: str | None) -> list[tuple[NodeRef, Exception]]:
    """Ask each of ``refs``' daemons to end (``Op.LEAVE``: its node is given back to
    Slurm next); the ones that could not be told, with their error (Slurm's shrink then
    ends them)."""
    failed = [(ref, _ask(ref, Op.LEAVE, timeout_s, munge_socket)) for ref in refs]
    return [(ref, exc) for ref, exc in failed if exc is not None]

