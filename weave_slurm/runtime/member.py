"""The group runner's live records: its config, a member, its phases in flight, and
which node runs what.

Values the :class:`~weave_slurm.runtime.runner.GroupRunner` keeps (mutable: the runner
and its :class:`~weave_slurm.runtime.lifecycle.Lifecycle` own them; readers such as the
daemon's status only read). Every change of a member's state goes through
``Lifecycle.move`` and its transition table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from weave_slurm.config.runtime import RuntimeConfig
from weave_slurm.errors import ConfigError
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.faults import Fault
from weave_slurm.runtime.gang import Gang, GangPorts, RankSlot
from weave_slurm.runtime.group import MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.ordering import rollout_ready
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.runtime.transfer import TransferConfig
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerConfig(RuntimeConfig):
    """How a group runner paces, recovers and moves data.

    Every key of the site's ``[runtime]`` table is a field of :class:`RuntimeConfig`,
    by its name and with its one default; :meth:`from_site` takes a site's. The fields
    below are the runner's own wiring, which no site sets. ``transfer`` is derived from
    ``weight_transfer``, ``sync_mode`` and ``sync_timeout_s`` (not passed).
    """

    poll_s: float = 0.005              # tick when nothing changed (tests pace it)
    records_dir: Path | None = None     # where <job>.versions.jsonl logs are kept
    progress_poll_s: float = 0.02      # least time between two reads of a rollout's progress
    munge_socket: str | None = None    # munged's socket for remote node daemons (default: munge's)
    # the shared root of the nodes' checkpoint roots (<base>/<node>), where weaved sees it
    checkpoint_base: Path | None = None
    gang_ports: GangPorts = field(default_factory=GangPorts)   # training gangs' rendezvous
    transfer: TransferConfig = field(init=False)   # weights train -> rollout (derived)

    @classmethod
    def from_site(cls, site: RuntimeConfig, **own: Any) -> RunnerConfig:
        """The site's ``[runtime]`` table, every key of it; ``own``: the runner's own
        fields (``munge_socket``, ``poll_s``, ...)."""
        return cls(**{f.name: getattr(site, f.name) for f in fields(RuntimeConfig)}, **own)

    def __post_init__(self) -> None:
        object.__setattr__(self, "transfer", TransferConfig.from_site(self))
        if not isinstance(self.long_tail_migration, bool):
            raise ConfigError(f"runtime.long_tail_migration: expected true or false, got "
                              f"{self.long_tail_migration!r}")
        if not 0.0 < self.tail_fraction < 1.0:
            raise ConfigError(f"runtime.tail_fraction: must be in (0, 1) (e.g. 0.25 = the "
                              f"last quarter of the requests), got {self.tail_fraction!r}")
        if self.progress_poll_s < 0:
            raise ConfigError(f"runner.progress_poll_s: must be >= 0, got "
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

    kind: Phase
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
    nodes: tuple[NodeRef, ...] = ()  # every node it holds (a training gang's), () = node

    def held(self) -> tuple[NodeRef, ...]:
        """The nodes this phase holds."""
        return self.nodes or (self.node,)


@dataclass
class RunningMember:
    """The runner's live view of one member (read it, do not change it)."""

    spec: MemberSpec
    job: JobRef
    train_node: NodeRef
    rollout_nodes: tuple[NodeRef, ...]
    state: MemberState = MemberState.STARTING
    version: int = 0                             # versions trained (train side)
    # False while an adopted member's version is not read from its checkpoint yet
    # (``version`` is a placeholder then: status shows it as unknown)
    version_known: bool = True
    next_kind: Phase = Phase.TRAIN       # init runs on the training node
    initialised: bool = False
    runs: dict[Phase, PhaseRun] = field(default_factory=dict)
    rolled: int = 0                              # batches produced (next rollout step)
    delivered: int = 0                           # batches on the training node
    deferred: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    versions: VersionLog | None = None
    recoveries: int = 0                          # recovery attempts, a previous weaved's too
    faults: int = 0                              # failures of its own (budgeted)
    node_fault_since: float | None = None        # waiting for an unavailable node
    rewards: list[float] = field(default_factory=list)
    history: list[tuple[float, MemberState, str]] = field(default_factory=list)
    error: str | None = None                     # the last failure, in words
    fault: Fault | None = None                   # what sent it to recovery (typed)
    outcome: str | None = None                   # ... and what was done about it
    restarts: int = 0                            # fresh starts (killed in its first phase)
    restart_note: str | None = None              # why it last started again from scratch
    warning: str | None = None                   # the last warning about it, in words
    retry_at_s: float = 0.0
    ready_s: float | None = None
    # the rollout nodes it moves to at its next phase boundary (the group's plan re-pinned
    # it): no rollout starts until then (``Relayout.repin``)
    repin: tuple[NodeRef, ...] | None = None
    repool: tuple[int, ...] | None = None   # ... and the pool it then has (None: unpooled)
    # a re-plan moves it to another group: it trains what it has rolled out, starts no
    # rollout, and is handed off once nothing is in flight (``Lifecycle.hand_offs``)
    handoff: bool = False
    gang: Gang | None = None     # its training ranks (runtime/gang.py), set when it joins
    engines: Gang | None = None  # its rollout engines when more than one (None: one)
    # step -> the engines its batch was rolled out as (a pooled member's width changes
    # between a rollout and the training step that merges its slices)
    sliced: dict[int, int] = field(default_factory=dict)

    def rolled_as(self, step: int, engines: int) -> None:
        """Rollout ``step`` was ``engines`` slices (batches already trained: forgotten)."""
        self.sliced = {s: n for s, n in self.sliced.items() if s >= self.version}
        self.sliced[step] = engines

    def slices_of(self, step: int) -> int:
        """The slices the training step of ``step`` merges: as its batch was rolled out
        (one it does not know of, e.g. a previous weaved's: as its engines are now)."""
        return self.sliced.get(step, 1 if self.engines is None else self.engines.size)

    def gang_of(self, kind: Phase, node: NodeRef) -> Gang:
        """Who runs its phase of ``kind`` (on ``node``): its training gang, its rollout
        engines, or its one process there."""
        gang = self.gang if kind is Phase.TRAIN else self.engines
        return gang if gang is not None else Gang((RankSlot(0, 0, node, self.job),))

    def start_over(self, note: str, restarts: int) -> None:
        """Forget everything learned and every fault: the member starts from scratch
        (the lifecycle then moves it to STARTING); the recoveries it had are still
        counted (stored, and said in its outcome)."""
        self.version, self.next_kind, self.initialised = 0, Phase.TRAIN, False
        self.version_known = True
        self.runs.clear()
        self.deferred.clear()
        self.rolled = self.delivered = 0
        self.faults = 0   # a fresh budget; ``recoveries`` counts on (its REASON says all)
        self.node_fault_since = None
        self.rewards.clear()
        self.error, self.fault, self.outcome = None, None, None
        self.retry_at_s, self.ready_s = 0.0, None
        self.restarts, self.restart_note = restarts, note

    def warn(self, words: str) -> None:
        """Something went wrong that neither fails nor recovers it (a checkpoint not
        moved, a re-pin not followed): weaved's log says so, and so does the job's
        REASON (``weave status``) and, once it ends, its outcome."""
        log.warning("job %s: %s", self.spec.job_id, words)
        self.warning = words

    def event(self) -> str | None:
        """Its last fault and what was done about it, in words (None: no fault)."""
        if self.fault is None:
            return None
        words = self.fault.words()
        if self.outcome is not None:
            return f"{words}; {self.outcome}"
        if self.error and self.error != words and self.recoveries:
            return f"{words}; recovering (attempt {self.recoveries}: {self.error})"
        return f"{words}; recovering"

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

    def given_up(self, cfg: RunnerConfig, now: float) -> str | None:
        """Why recovery stops now (None: try again)."""
        since = self.node_fault_since
        if since is not None and now - since > cfg.node_wait_s:
            return (f"gave up after waiting {cfg.node_wait_s:.0f} s for an unavailable "
                    f"node: {self.error}")
        if self.faults > cfg.max_recoveries:
            return f"gave up after {self.faults} failures: {self.error}"
        return None

    def backoff_s(self, cfg: RunnerConfig) -> float:
        """Time before the next recovery attempt (a restarting node daemon gets time)."""
        ours = self.recoveries - self.spec.recoveries   # this weaved's attempts
        doubled = cfg.recovery_backoff_s * float(2 ** min(max(ours - 1, 0), 16))
        return min(cfg.recovery_backoff_max_s, doubled)

    @property
    def running(self) -> PhaseRun | None:
        """The phase in flight (its training first when a stale member runs two)."""
        return self.runs.get(Phase.TRAIN) or self.runs.get(Phase.ROLLOUT)

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

    def wants(self) -> Phase | None:
        """The phase a member may start now, if any (the window decides, not alternation)."""
        if self.state not in (MemberState.READY, MemberState.STARTING,
                              MemberState.ROLLOUT, MemberState.TRAIN):
            return None
        if not self.initialised:
            return Phase.TRAIN if not self.runs and not self.handoff else None
        if Phase.TRAIN not in self.runs and self.version < self.spec.steps \
                and self.delivered > self.version:
            return Phase.TRAIN
        if Phase.ROLLOUT not in self.runs and (self.staleness > 0 or not self.runs) \
                and self.repin is None and not self.handoff \
                and rollout_ready(self.rolled, self.version, self.staleness, self.spec.steps):
            return Phase.ROLLOUT
        return None


@dataclass
class NodeSlots:
    """Which member each node of the group serves now: its bulk phase, and at most one
    migrated rollout tail beside the next member's rollout."""

    busy: dict[str, str] = field(default_factory=dict)     # node name -> job id
    tails: dict[str, str] = field(default_factory=dict)    # node name -> job id of its tail

    def free_run(self, job_id: str, run: PhaseRun) -> None:
        """Every node ``run`` held is free."""
        for node in run.held():
            self.free(job_id, node.name)

    def free(self, job_id: str, node: str) -> None:
        """The node ``job_id`` held is free (its bulk or its migrated tail)."""
        if self.busy.get(node) == job_id:
            self.busy.pop(node, None)
        if self.tails.get(node) == job_id:
            self.tails.pop(node, None)
