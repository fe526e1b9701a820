"""What weaved asks of a group's runtime: commands, as frozen values.

weaved's group runtime (``daemon/group_runtime.py``) translates the store's rows into
these and applies them through the one door, :meth:`GroupPort.apply
<weave_slurm.runtime.port.GroupPort.apply>`, as Ray autoscaler v2's instance manager
takes its updates: one writer, each update a value, every input passed in (a
checkpoint base, a source label, the nodes lost), nothing read from the caller later.
A command that cannot be carried out raises a typed error
(:class:`~weave_slurm.errors.WeaveError`: ``ConfigError`` for a bad value,
``StateError`` for a wrong moment); what it did is reported as events
(:mod:`~weave_slurm.runtime.port_events`).

Membership: :class:`Join`, :class:`Adopt`, :class:`Leave`, :class:`Fail`.
Moves between groups: :class:`HandOff`, :class:`TakeHandOffs`, :class:`Drop`.
The group's plan: :class:`Repin`, :class:`SetTurns`, :class:`Extend`, :class:`Retire`.
Loss and the end: :class:`Detach`, :class:`FinalDigest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weave_slurm.runtime.faults import Fault
from weave_slurm.runtime.group import MemberSpec, NodeRef
from weave_slurm.runtime.resume import Resume


@dataclass(frozen=True)
class Join:
    """Add a fresh member at the end of the cyclic order."""

    spec: MemberSpec


@dataclass(frozen=True)
class Adopt:
    """Join a member that may have warm state on its nodes (a previous weaved's, or a
    checkpoint carried from a lost or old training node: ``resume``)."""

    spec: MemberSpec
    resume: Resume | None = None


@dataclass(frozen=True)
class Leave:
    """Cancel a member: stop its phase, drop its state, workers and checkpoints."""

    job_id: str


@dataclass(frozen=True)
class Fail:
    """Only this member: stop what it runs, then recover it from ``fault``."""

    job_id: str
    fault: Fault


@dataclass(frozen=True)
class HandOff:
    """A re-plan moves the member to another group: it finishes the step it rolled
    out, starts nothing more, and is handed off at that boundary (:class:`TakeHandOffs`)."""

    job_id: str


@dataclass(frozen=True)
class TakeHandOffs:
    """Hand off every member that reached its boundary: checkpointed under
    ``checkpoint_base``, MOVED; one ``HandedOff`` event each (``source`` names this
    group in their reasons)."""

    checkpoint_base: Path | None
    source: str


@dataclass(frozen=True)
class Drop:
    """Drop what ``job_id`` left on every node of the group (best effort: a member
    this runtime does not hold, e.g. after a weaved restart mid-move)."""

    job_id: str


@dataclass(frozen=True)
class Repin:
    """Move the member's rollouts to the layout's rollout nodes ``pins`` (indices) at
    its next phase boundary; ``pool``: pooled over that many GPUs on each pin, in pin
    order (a width change, ``runtime/pool.py``; None: not pooled)."""

    job_id: str
    pins: tuple[int, ...]
    pool: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SetTurns:
    """A member's steps per round, as placement re-planned them."""

    job_id: str
    turns: int


@dataclass(frozen=True)
class Extend:
    """Add the rollout nodes of an allocation newly held for the group (their node
    daemons answer); the members keep running."""

    nodes: tuple[NodeRef, ...]


@dataclass(frozen=True)
class Retire:
    """Drop rollout nodes no member is on, moving to or runs a phase on any more."""

    names: frozenset[str]


@dataclass(frozen=True)
class Detach:
    """The group lost ``lost``: decide how each member goes on (one ``Detached``
    event each; nothing is dropped)."""

    lost: tuple[NodeRef, ...]
    checkpoint_base: Path | None


@dataclass(frozen=True)
class FinalDigest:
    """Read the digest of a finished member's final weights (a ``Digested`` event)."""

    job_id: str


Command = (Join | Adopt | Leave | Fail | HandOff | TakeHandOffs | Drop | Repin | SetTurns
           | Extend | Retire | Detach | FinalDigest)
