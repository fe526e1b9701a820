"""How long a group's runtime waits for its node daemons, and what then (docs/daemon.md).

Before a group's runtime can run its members it must reach every node daemon of its
allocations: learn the port each said (its step's ready line), connect, authenticate
with munge and be answered. While it cannot, the waiting jobs' REASON says why
(``waiting: ...``, with the time left). Each wait has a cause (:class:`WaitCause`, a
typed value taken from the error's type, never from its words) and a deadline from the
site's ``[runtime]`` table:

- a node daemon that has not said its port, or does not answer (``node_start_wait_s``):
  a cause that may pass (a slow or broken node, a daemon that died): the waiting jobs
  are requeued (PENDING, placed again), at most ``max_requeues`` times each; past
  that they fail, the count in their reason;
- authentication failing: weaved cannot make a munge credential, or the node daemon
  refuses it (``auth_wait_s``): it does not pass without a person (a wrong munge
  socket, another munge key), so the waiting jobs fail.

Either way the jobs leave their group; a group left without members drains and its
allocations go back to Slurm (the reconcile loop). A job whose move waits for its
new group is not judged here: ``move_wait_s`` bounds that wait
(:mod:`~weave_slurm.daemon.handoff`). The clock is the caller's (``now``); a wait is
timed from when this weaved first saw its cause (a restart times it again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from weave_slurm.config.runtime import RUNTIME_DEFAULTS, RuntimeConfig
from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.daemon.records import GroupRow, TransitionRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import AuthError, ConfigError

log = logging.getLogger(__name__)


class WaitCause(StrEnum):
    """Why a group's runtime cannot reach a node daemon yet."""

    NODE_PORT = "node-port"       # weaved does not know where it listens: no port said
                                  # yet (its ready line), or no address from Slurm
    NODE_SILENT = "node-silent"   # it does not answer (nobody listens, no reply in time)
    AUTH = "auth"                 # munge: weaved cannot make a credential, or the node
                                  # daemon refuses it

    @property
    def passes(self) -> bool:
        """Whether the cause may pass by itself (requeue), or needs a person (fail)."""
        return self is not WaitCause.AUTH

    @property
    def key(self) -> str:
        """The ``[runtime]`` key of its deadline."""
        return "auth_wait_s" if self is WaitCause.AUTH else "node_start_wait_s"


def answer_cause(exc: BaseException) -> WaitCause:
    """The cause of a failed connect-and-ping of a node daemon, by the error's type:
    munge failing (``AuthError``; ``ConfigError``: libmunge or its socket unusable) is
    AUTH, anything else NODE_SILENT."""
    return WaitCause.AUTH if isinstance(exc, (AuthError, ConfigError)) \
        else WaitCause.NODE_SILENT


@dataclass(frozen=True)
class Deadlines:
    """The ``[runtime]`` deadlines of a group's start (``node_start_wait_s``,
    ``auth_wait_s``) and the requeue bound (``max_requeues``) of ``runtime``."""

    runtime: RuntimeConfig = RUNTIME_DEFAULTS

    @property
    def max_requeues(self) -> int:
        return self.runtime.max_requeues

    def of(self, cause: WaitCause) -> float:
        rt = self.runtime
        return rt.auth_wait_s if cause is WaitCause.AUTH else rt.node_start_wait_s

    def verdict(self, group_id: int, cause: WaitCause, words: str,
                requeues: int) -> tuple[JobState, str]:
        """What a job whose group missed ``cause``'s deadline becomes, and why: PENDING
        (requeued) while the cause may pass and the job has been requeued fewer than
        ``max_requeues`` times, else FAILED."""
        what = (f"group {group_id} could not reach its node daemons within {cause.key} = "
                f"{self.of(cause):g} s: {words}")
        if not cause.passes:
            return JobState.FAILED, (f"{what} (authentication does not pass by itself: "
                                     "check weaved's and the nodes' munge socket and key)")
        if requeues >= self.max_requeues:
            return JobState.FAILED, (f"{what}; requeued {requeues} time(s) already "
                                     f"(max_requeues = {self.max_requeues})")
        return JobState.PENDING, (f"requeued ({requeues + 1} of max_requeues = "
                                  f"{self.max_requeues}): {what}")


def requeue_rows(transitions: Sequence[TransitionRow]) -> list[TransitionRow]:
    """A job's requeues among its transitions: the RUNNING -> PENDING ones."""
    return [t for t in transitions
            if t.src == JobState.RUNNING.value and t.dst == JobState.PENDING.value]


def requeues(store: Store, job_id: int) -> int:
    """How many times a job was requeued: its stored RUNNING -> PENDING transitions (a
    restart keeps the count)."""
    return len(requeue_rows(store.transitions("job", job_id)))


def with_requeues(reason: str, requeued: Sequence[TransitionRow], state: JobState) -> str:
    """A job's REASON: ``reason`` (what it waits for now, if anything) followed by why it
    was last requeued, until it ends. Placing a requeued job again clears its stored
    reason, and Slurm keeps a requeued job's Reason too; an ended job's REASON is why it
    ended (the count of requeues is in ``weave show job``: ``requeues``)."""
    if not requeued or state.final:
        return reason
    last = requeued[-1].reason
    return last if reason in ("", last) else f"{reason}; {last}"


@dataclass
class _Wait:
    since: dict[WaitCause, float]   # when each cause was first seen in this wait
    cause: WaitCause                # the latest one
    words: str
    jobs: tuple[int, ...]


class GroupWaits:
    """Per group: what its runtime waits for, since when, and which jobs wait."""

    def __init__(self, deadlines: Deadlines | None = None) -> None:
        self.deadlines = deadlines or Deadlines()
        self.jobs: dict[int, str] = {}   # job -> why it waits (its REASON); moves add theirs
        self._waits: dict[int, _Wait] = {}

    def wait(self, group: GroupRow, cause: WaitCause, words: str, now: float,
             jobs: Sequence[int] | None = None) -> None:
        """The group's runtime cannot reach a node daemon (``jobs``: those that wait,
        default every member of its plan); logged once per distinct reason."""
        gid, ids = group.group_id, tuple(group.plan.job_ids if jobs is None else jobs)
        old = self._waits.get(gid)
        since = dict(old.since) if old is not None else {}
        since.setdefault(cause, now)
        if old is None or old.words != words:
            log.warning("group %s: waiting for its node daemons: %s", gid, words)
        self._waits[gid] = _Wait(since, cause, words, ids)
        left = since[cause] + self.deadlines.of(cause) - now
        self.jobs.update({j: f"{words} ({cause.key}: {max(0.0, left):.0f} s left)"
                          for j in ids})

    def done(self, group: GroupRow) -> None:
        """The group's runtime reached its node daemons: no wait any more."""
        wait = self._waits.pop(group.group_id, None)
        for job_id in wait.jobs if wait is not None else ():
            self.jobs.pop(job_id, None)

    def overdue(self, store: Store, now: float) -> list[JobOutcome]:
        """The outcomes of the waiting jobs whose group is past its cause's deadline. A
        job being moved by a re-plan is left to its move's own deadline."""
        outcomes = []
        for gid, wait in list(self._waits.items()):
            if now - wait.since[wait.cause] < self.deadlines.of(wait.cause):
                continue
            if self._waits.pop(gid, None) is None:   # its worker reached its nodes meanwhile
                continue
            for job_id in wait.jobs:
                self.jobs.pop(job_id, None)
                job = store.job(job_id)
                if job is None or job.state is not JobState.RUNNING \
                        or job.moving_from is not None:
                    continue
                state, why = self.deadlines.verdict(gid, wait.cause, wait.words,
                                                    requeues(store, job_id))
                log.warning("job %s: %s", job_id, why)
                outcomes.append(JobOutcome(job_id, state, why))
        return outcomes
