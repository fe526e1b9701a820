"""The daemon's state machines: jobs, groups, allocations and steps, with ONE edge table.

Every persisted state change goes through :func:`check_transition`, so an edge
that is not in :data:`TRANSITIONS` can never be written. Each edge carries a
comment saying when it is taken; ``docs/daemon.md`` renders the same table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from weave_slurm.errors import StateError


class JobState(StrEnum):
    """Where a submitted RL job is."""

    PENDING = "PENDING"  # accepted, waiting for a placement
    PLACED = "PLACED"  # has a group; waiting for its allocations / steps
    RUNNING = "RUNNING"  # its steps run inside the group's allocations
    CANCELLING = "CANCELLING"  # the user cancelled; steps being stopped
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    REFUSED = "REFUSED"  # can never be placed as asked

    @property
    def final(self) -> bool:
        return self in _FINAL_JOB

    @property
    def short(self) -> str:
        """squeue's two-letter code (%t)."""
        return _SHORT[self]


_FINAL_JOB = frozenset({JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED,
                        JobState.REFUSED})
_SHORT = {JobState.PENDING: "PD", JobState.PLACED: "CF", JobState.RUNNING: "R",
          JobState.CANCELLING: "CG", JobState.CANCELLED: "CA", JobState.COMPLETED: "CD",
          JobState.FAILED: "F", JobState.REFUSED: "RF"}


class GroupState(StrEnum):
    """Where a co-execution group is."""

    FORMING = "FORMING"  # members placed, allocations being obtained
    ACTIVE = "ACTIVE"  # every allocation held and every node daemon running
    DRAINING = "DRAINING"  # no members left; allocations being released
    RELEASED = "RELEASED"

    @property
    def final(self) -> bool:
        return self is GroupState.RELEASED


class AllocState(StrEnum):
    """One Slurm allocation of a group (one pool, or an extra rollout slice)."""

    WANTED = "WANTED"  # the group needs it; no call made yet
    ALLOCATING = "ALLOCATING"  # intent: the allocate call may have happened
    HELD = "HELD"  # granted; alloc_id known
    RELEASING = "RELEASING"  # intent: the release call may have happened
    RELEASED = "RELEASED"
    LOST = "LOST"  # vanished from Slurm while held
    FAILED = "FAILED"  # Slurm refuses the request as asked

    @property
    def final(self) -> bool:
        return self in (AllocState.RELEASED, AllocState.LOST, AllocState.FAILED)


class StepRunState(StrEnum):
    """One step the daemon launched (a node daemon or a job's work)."""

    LAUNCHING = "LAUNCHING"  # intent: the launch call may have happened
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # intent: the cancel call may have happened
    ENDED = "ENDED"

    @property
    def final(self) -> bool:
        return self is StepRunState.ENDED


State = JobState | GroupState | AllocState | StepRunState

J, G, A, S = JobState, GroupState, AllocState, StepRunState

#: Every legal edge, with when it is taken. The one transition table.
TRANSITIONS: dict[tuple[State, State], str] = {
    # jobs
    (J.PENDING, J.PLACED): "placement found a group (direct, scaled rollout or new)",
    (J.PENDING, J.REFUSED): "placement says it can never fit this site",
    (J.PENDING, J.CANCELLED): "cancelled before placement: nothing to stop",
    (J.PLACED, J.RUNNING): "group active and the job's steps launched",
    (J.PLACED, J.CANCELLING): "cancelled while its group was forming",
    (J.PLACED, J.FAILED): "Slurm refuses its group's allocation as asked, or its node "
                          "daemons keep failing",
    (J.RUNNING, J.PENDING): "requeued: its group could not reach its node daemons by "
                            "[runtime] node_start_wait_s (a cause that may pass)",
    (J.RUNNING, J.CANCELLING): "cancelled while running",
    (J.RUNNING, J.COMPLETED): "its steps ended with exit code 0",
    (J.RUNNING, J.FAILED): "a step failed or vanished, its allocation was lost, its "
                           "node daemons keep failing, or its group could not reach "
                           "them by a deadline (munge failing; requeued max_requeues "
                           "times)",
    (J.CANCELLING, J.CANCELLED): "its steps are stopped and it left its group",
    # groups
    (G.FORMING, G.ACTIVE): "every allocation held, every node daemon running",
    (G.FORMING, G.DRAINING): "its last member left (or failed) before it became active",
    (G.ACTIVE, G.FORMING): "needs another allocation (rollout scaling or a lost one)",
    (G.ACTIVE, G.DRAINING): "its last member left",
    (G.DRAINING, G.RELEASED): "every allocation released",
    # allocations
    (A.WANTED, A.ALLOCATING): "intent written; the allocate call follows",
    (A.WANTED, A.RELEASED): "no longer needed before any call was made",
    (A.ALLOCATING, A.HELD): "the call returned an id, or Slurm lists it (adopted)",
    (A.ALLOCATING, A.WANTED): "not granted now (retry later), or not in Slurm after a restart",
    (A.ALLOCATING, A.FAILED): "Slurm refuses the request as asked",
    (A.HELD, A.RELEASING): "intent written; the release call follows",
    (A.HELD, A.LOST): "Slurm no longer lists it",
    (A.RELEASING, A.RELEASED): "the release call returned (or it is gone from Slurm)",
    # steps
    (S.LAUNCHING, S.RUNNING): "the launch call returned, or Slurm lists it (adopted)",
    (S.LAUNCHING, S.ENDED): "the launch failed, or it is not in Slurm after a restart",
    (S.LAUNCHING, S.STOPPING): "cancelled before its launch was confirmed",
    (S.RUNNING, S.STOPPING): "intent written; the cancel call follows",
    (S.RUNNING, S.ENDED): "it exited or vanished",
    (S.STOPPING, S.ENDED): "the cancel call returned",
}


def check_transition(src: State, dst: State) -> str:
    """The edge's comment; StateError if ``src -> dst`` is not in the table."""
    try:
        return TRANSITIONS[(src, dst)]
    except KeyError:
        allowed = sorted(d.value for (s, d) in TRANSITIONS if s is src)
        raise StateError(f"illegal {type(src).__name__} transition {src.value} -> "
                         f"{dst.value}; from {src.value} only: {allowed or 'none (final)'}") \
            from None


_S = TypeVar("_S", JobState, GroupState, AllocState, StepRunState)


def state_of(kind: type[_S], value: str) -> _S:
    """Parse a stored state; StateError naming the valid values otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise StateError(f"stored {kind.__name__} {value!r} is unknown; valid: "
                         f"{[s.value for s in kind]}") from None
