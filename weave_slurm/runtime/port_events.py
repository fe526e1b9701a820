"""What a group's runtime reports to weaved: events, as frozen values.

The runtime is driven through one door (:class:`~weave_slurm.runtime.port.GroupPort`):
commands go in (:mod:`~weave_slurm.runtime.port_commands`), events come out. An event says
what happened to a member, in types a caller matches on (never words to parse):

- :class:`MemberChanged`: every change of a member's state, with its reason (the
  transition table's edge, :data:`~weave_slurm.runtime.group.TRANSITIONS`);
- :class:`MemberEnded`: the member reached its iterations (DONE) or recovery gave up
  (FAILED); weaved reports the job's outcome;
- :class:`Faulted`: a typed fault sent the member to recovery;
- :class:`HandedOff`: a member moving to another group stopped at its step boundary
  and how it goes on there (:class:`~weave_slurm.runtime.resume.Resume`);
- :class:`Detached`: the group lost nodes; how each member goes on;
- :class:`Digested`: a finished member's final weights' digest, read on its node.

Events are recorded in order in an outbox (:class:`Outbox`) that the port drains; a
change is recorded after the transition table allowed it and before anyone acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.runtime.faults import Fault
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.resume import Resume


@dataclass(frozen=True)
class MemberChanged:
    """``job_id`` moved to ``state`` at ``at_s`` (runtime clock), because ``why``."""

    job_id: str
    state: MemberState
    why: str
    at_s: float


@dataclass(frozen=True)
class MemberEnded:
    """``job_id`` is DONE or FAILED: its job's outcome can be reported."""

    job_id: str
    state: MemberState
    why: str


@dataclass(frozen=True)
class Faulted:
    """A fault sent ``job_id`` to recovery (only this member)."""

    job_id: str
    fault: Fault


@dataclass(frozen=True)
class HandedOff:
    """``job_id`` left for another group at its step boundary (now MOVED here)."""

    job_id: str
    resume: Resume


@dataclass(frozen=True)
class Detached:
    """The group lost nodes: how ``job_id`` goes on (nothing was dropped)."""

    job_id: str
    resume: Resume


@dataclass(frozen=True)
class Digested:
    """The SHA-256 of ``job_id``'s final weights, computed on its training node."""

    job_id: str
    sha256: str


Event = MemberChanged | MemberEnded | Faulted | HandedOff | Detached | Digested

_ENDS = (MemberState.DONE, MemberState.FAILED)


class Outbox:
    """The events of one group's runtime in order, until the port drains them."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    def put(self, event: Event) -> None:
        self._events.append(event)

    def changed(self, job_id: str, state: MemberState, why: str, at_s: float,
                fault: Fault | None) -> None:
        """A member's state changed: the change, and what it means to weaved."""
        self.put(MemberChanged(job_id, state, why, at_s))
        if state is MemberState.RECOVERING and fault is not None:
            self.put(Faulted(job_id, fault))
        if state in _ENDS:
            self.put(MemberEnded(job_id, state, why))

    def drain(self) -> list[Event]:
        """Every event since the last drain, oldest first."""
        out, self._events = self._events, []
        return out
