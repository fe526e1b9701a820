"""The executor's live records: its clock, its config, a member and its phases in flight.

Values the :class:`~weave_slurm.runtime.executor.GroupExecutor` keeps per member
(mutable: the executor owns them; readers such as the daemon's status only read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from weave_slurm.errors import ConfigError
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import MemberSpec, MemberState, NodeRef, PhaseKind
from weave_slurm.runtime.ordering import rollout_ready
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.runtime.transfer import TransferConfig


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock (the simulator passes a virtual one)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class ExecutorConfig:
    poll_s: float = 0.005
    deadline_factor: float = 4.0        # hung = longer than factor x longest seen
    deadline_floor_s: float = 60.0      # ... but never before this
    max_recoveries: int = 3             # re-admissions after faults of the member itself
    recovery_backoff_s: float = 1.0     # between attempts when a node is unreachable ...
    recovery_backoff_max_s: float = 10.0  # ... doubling up to this
    # a node that is gone, stopping or restarting is not the member's fault: it waits
    # this long for the node (or a replacement allocation) before it fails
    node_wait_s: float = 300.0
    records_dir: Path | None = None     # where <job>.versions.jsonl logs are kept
    transfer: TransferConfig = field(default_factory=TransferConfig)  # weights train -> rollout
    # long-tail migration (docs/runtime.md): a rollout whose remaining requests fell to
    # tail_fraction x its requests frees its node for the next member's rollout
    migrate_tail: bool = False
    tail_fraction: float = 0.25
    progress_poll_s: float = 0.02      # least time between two reads of a rollout's progress

    def __post_init__(self) -> None:
        if not isinstance(self.migrate_tail, bool):
            raise ConfigError(f"executor.migrate_tail: expected true or false, got "
                              f"{self.migrate_tail!r}")
        if not 0.0 < self.tail_fraction < 1.0:
            raise ConfigError(f"executor.tail_fraction: must be in (0, 1) (e.g. 0.25 = the "
                              f"last quarter of the requests), got {self.tail_fraction!r}")
        if self.progress_poll_s < 0:
            raise ConfigError(f"executor.progress_poll_s: must be >= 0, got "
                              f"{self.progress_poll_s!r}")


@dataclass(frozen=True)
class TailMove:
    """A rollout that entered its tail: its node was freed for the next member at ``at_s``."""

    job_id: str
    node: str
    step: int
    at_s: float
    remaining: int
    total: int


@dataclass
class PhaseRun:
    """One phase of a member in flight on a node."""

    kind: PhaseKind
    node: NodeRef
    start_s: float
    deadline_s: float
    init: bool = False
    ready_s: float | None = None
    step: int = 0                   # rollout: its step m; train: the held version
    ended: bool = False             # the node is free; output not moved yet
    run_id: str | None = None       # a rollout that reports progress (migration on)
    tail_s: float | None = None     # when it entered its tail (its node was freed)
    progress_at_s: float = 0.0      # when its progress was last read


@dataclass
class Member:
    """The executor's live view of one member (read it, do not change it)."""

    spec: MemberSpec
    job: JobRef
    train_node: NodeRef
    rollout_nodes: tuple[NodeRef, ...]
    state: MemberState = MemberState.STARTING
    version: int = 0                             # versions trained (train side)
    next_kind: PhaseKind = PhaseKind.TRAIN       # init runs on the training node
    initialised: bool = False
    runs: dict[PhaseKind, PhaseRun] = field(default_factory=dict)
    rolled: int = 0                              # batches produced (next rollout step)
    delivered: int = 0                           # batches on the training node
    deferred: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    versions: VersionLog | None = None
    recoveries: int = 0                          # recovery attempts
    faults: int = 0                              # failures of its own (budgeted)
    node_fault_since: float | None = None        # waiting for an unavailable node
    rewards: list[float] = field(default_factory=list)
    history: list[tuple[float, MemberState, str]] = field(default_factory=list)
    error: str | None = None
    retry_at_s: float = 0.0
    ready_s: float | None = None

    # -- the recovery budget -------------------------------------------------------
    def charge(self, node_fault: bool, now: float) -> None:
        """A failure: the member's own costs budget; a node's starts (or continues) the
        wait for that node."""
        if node_fault:
            if self.node_fault_since is None:
                self.node_fault_since = now
        else:
            self.faults += 1
            self.node_fault_since = None

    def given_up(self, cfg: ExecutorConfig, now: float) -> str | None:
        """Why recovery stops now (None: try again)."""
        since = self.node_fault_since
        if since is not None and now - since > cfg.node_wait_s:
            return (f"gave up after waiting {cfg.node_wait_s:.0f} s for an unavailable "
                    f"node: {self.error}")
        if self.faults > cfg.max_recoveries:
            return f"gave up after {self.faults} failures: {self.error}"
        return None

    def backoff_s(self, cfg: ExecutorConfig) -> float:
        """Time before the next recovery attempt (a restarting node daemon gets time)."""
        doubled = cfg.recovery_backoff_s * float(2 ** min(max(self.recoveries - 1, 0), 16))
        return min(cfg.recovery_backoff_max_s, doubled)

    @property
    def running(self) -> PhaseRun | None:
        """The phase in flight (its training first when a stale member runs two)."""
        return self.runs.get(PhaseKind.TRAIN) or self.runs.get(PhaseKind.ROLLOUT)

    @property
    def staleness(self) -> int:
        return self.spec.staleness

    def status_row(self) -> dict[str, object]:
        """A status view's row; ``current_staleness`` is the version lag of the last
        batch it trained on (None before the first), ``staleness`` its window k."""
        run = self.running
        return {"job": self.spec.job_id, "state": self.state.value, "version": self.version,
                "steps": self.spec.steps, "phase": run.kind.value if run else None,
                "node": run.node.name if run else None,
                "phases": sorted(r.kind.value for r in self.runs.values()),
                "reward": self.rewards[-1] if self.rewards else None,
                "recoveries": self.recoveries, "error": self.error,
                "staleness": self.staleness,
                "current_staleness": None if self.versions is None
                else self.versions.current_staleness(),
                "tail": any(r.tail_s is not None and not r.ended for r in self.runs.values())}

    def wants(self) -> PhaseKind | None:
        """The phase a member may start now, if any (the window decides, not alternation)."""
        if self.state not in (MemberState.READY, MemberState.STARTING,
                              MemberState.ROLLOUT, MemberState.TRAIN):
            return None
        if not self.initialised:
            return PhaseKind.TRAIN if not self.runs else None
        if PhaseKind.TRAIN not in self.runs and self.version < self.spec.steps \
                and self.delivered > self.version:
            return PhaseKind.TRAIN
        if PhaseKind.ROLLOUT not in self.runs and (self.staleness > 0 or not self.runs) \
                and rollout_ready(self.rolled, self.version, self.staleness, self.spec.steps):
            return PhaseKind.ROLLOUT
        return None
