"""A member's faults as values: what failed, where, and the evidence.

The group runner turns every failure it sees into a :class:`Fault` (its kind, node,
phase, return code and the evidence) and recovery decides on the kind, never on
message text. :meth:`Fault.words` is the one sentence people see (``weave status``
REASON); nothing parses it back.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum

from weave_slurm.errors import (
    NoCheckpoint,
    NodeGone,
    NodeUnavailable,
    VersionMismatch,
    WeaveError,
)
from weave_slurm.sync.sync_errors import AgentDidNotStart, SyncError
from weave_slurm.vocab import Phase


class FaultKind(StrEnum):
    """What went wrong; the recovery a kind gets is in :mod:`weave_slurm.runtime.lifecycle`."""

    WORKER_KILLED = "worker-killed"      # the phase's worker died of a signal (or of
                                         # something that left no exit status)
    WORKER_EXITED = "worker-exited"      # the worker process exited with a code
    PHASE_FAILED = "phase-failed"        # the job's phase code raised; the worker said why
    PHASE_HUNG = "phase-hung"            # the phase ran past its deadline
    NODE_GONE = "node-gone"              # the node daemon does not answer
    NODE_STOPPING = "node-stopping"      # the node daemon takes no work now (stopping,
                                         # restarting its worker pool)
    NO_CHECKPOINT = "no-checkpoint"      # a restore found no checkpoint of the member
    VERSION_REFUSED = "version-refused"  # a copy or phase refused a weights version
    SYNC_FAILED = "sync-failed"          # the weight transfer between nodes failed
    STEP_FAILED = "step-failed"          # Slurm could not start a step on the node (its
                                         # slurmd does not answer): the node's fault
    REQUEST_FAILED = "request-failed"    # a node daemon refused a request (budget, ...)
    REATTACHED = "reattached"            # not a failure of its own: its warm state was
                                         # adopted (a weaved restart, lost nodes) and is
                                         # restored from its checkpoint

    @property
    def node_fault(self) -> bool:
        """The node's fault, not the member's: it costs no recovery budget."""
        return self in (FaultKind.NODE_GONE, FaultKind.NODE_STOPPING, FaultKind.STEP_FAILED)

    @property
    def restartable(self) -> bool:
        """A member that dies of this in its first phase may start again from scratch
        (nothing learned yet, nothing of its own wrong)."""
        return self is FaultKind.WORKER_KILLED or self.node_fault


@dataclass(frozen=True)
class Fault:
    """One failure of a member (or of a request made for it)."""

    kind: FaultKind
    node: str | None = None
    phase: Phase | None = None
    returncode: int | None = None     # a worker's exit status (< 0: killed by -signal)
    evidence: str = ""                # the underlying error or worker message, for people
    during: str | None = None         # what the runner was doing ("start", "after", ...)

    @classmethod
    def from_error(cls, exc: WeaveError, node: str | None = None,
                   phase: Phase | None = None, during: str | None = None) -> Fault:
        """The fault a failed request stands for, by the error's type; a node daemon
        that does not answer is named by the error, where it says which one."""
        if isinstance(exc, NodeUnavailable) and exc.node is not None:
            node = exc.node
        return cls(error_kind(exc), node, phase, None, str(exc), during)

    def words(self) -> str:
        """One sentence: which worker or daemon, what, when."""
        k, node, phase = self.kind, self.node, self.phase
        where = f"{phase.value} on {node}" if phase is not None else f"on {node}"
        if k is FaultKind.NODE_GONE:
            return f"node daemon on node {node} stopped answering ({self.evidence})"
        if k is FaultKind.WORKER_KILLED:
            if self.returncode is None and self.evidence:
                return f"{where} killed: {self.evidence}"
            if self.returncode is None:
                return (f"worker on node {node} killed during {_phase(phase)} "
                        "(exit status not known)")
            num = -self.returncode
            return (f"worker on node {node} killed by signal {num} ({signal_name(num)}) "
                    f"during {_phase(phase)}")
        if k is FaultKind.WORKER_EXITED:
            if self.returncode is None:
                return (f"worker on node {node} failed during {_phase(phase)} "
                        "(exit status not known)")
            return (f"worker on node {node} exited with code {self.returncode} during "
                    f"{_phase(phase)}")
        if k is FaultKind.PHASE_FAILED:
            return f"{where} failed: {self.evidence}"
        if k is FaultKind.PHASE_HUNG:
            return f"{where} hung: {self.evidence}"
        if self.during is not None:
            return f"{self.during} {where}: {self.evidence}"
        return self.evidence


def error_kind(exc: WeaveError) -> FaultKind:
    """The fault kind of an error raised by a node daemon, its client or a transfer."""
    if isinstance(exc, NodeGone):
        return FaultKind.NODE_GONE
    if isinstance(exc, NodeUnavailable):
        return FaultKind.NODE_STOPPING
    if isinstance(exc, NoCheckpoint):
        return FaultKind.NO_CHECKPOINT
    if isinstance(exc, VersionMismatch):
        return FaultKind.VERSION_REFUSED
    if isinstance(exc, AgentDidNotStart):
        return FaultKind.STEP_FAILED
    if isinstance(exc, SyncError):
        return FaultKind.SYNC_FAILED
    return FaultKind.REQUEST_FAILED


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _phase(phase: Phase | None) -> str:
    return phase.value if phase is not None else "a phase"
