"""Recovery: a member after a fault goes on from its newest checkpoint, alone.

Recovery decides on a fault's type (:class:`~weave_slurm.runtime.faults.Fault`), never
on its words. A failure touches only its member: what it runs is stopped, and it is
re-admitted from the newest checkpoint on its training node (weights copied to its
rollout nodes) while the others keep running. Its own faults spend the budget
``max_recoveries``; a node that is gone or stopping is waited for up to ``node_wait_s``
(:meth:`~weave_slurm.runtime.member.RunningMember.charge`). A member with nothing
learned yet (killed in its first phase, or adopted before its first checkpoint) starts
again from scratch, at most ``max_fresh_restarts`` times for faults of its own.

Every change of state goes through the member's owner, :class:`~weave_slurm.runtime.
lifecycle.Lifecycle`; :class:`Recovery` only decides and moves data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from weave_slurm.errors import NoCheckpoint, StateError, WeaveError
from weave_slurm.hosted import contract
from weave_slurm.hosted.contract import WEIGHTS_BUFFER, buffer_name, rollout_version
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.lifecycle import Lifecycle, member_nodes, training_gang
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)


class Recovery:
    """Failures and re-admissions of the members of ``lifecycle`` (see module doc);
    ``spans``: the group's timeline, where a phase cut short is recorded."""

    def __init__(self, lifecycle: Lifecycle, spans: list[Span]) -> None:
        self.lc, self.spans = lifecycle, spans

    def fail(self, member: RunningMember, fault: Fault) -> None:
        """Only this member: stop what it runs, then re-admit it (see module doc)."""
        words = fault.words()
        log.warning("member %s failed: %s", member.spec.job_id, words)
        member.charge(fault.kind.node_fault, self.lc.clock.now())
        for run in list(member.runs.values()):
            if not run.ended:
                self.spans.append(Span(member.spec.job_id, run.kind, run.node.name,
                                       run.node.pool, run.start_s, self.lc.clock.now(),
                                       ok=False))
                member.gang_of(run.kind, run.node).deactivate(self.lc.link)   # every rank
            self.lc.release(member, run)
        member.deferred.clear()
        member.error = words
        if member.state is MemberState.STARTING:
            if not self._restartable(member, fault):
                self.lc.move(member, MemberState.FAILED, words)
                return
        elif member.state is MemberState.RECOVERING:
            return
        member.fault, member.outcome = fault, None
        self.lc.move(member, MemberState.RECOVERING, words)

    def _restartable(self, member: RunningMember, fault: Fault) -> bool:
        """May a member that failed in its first phase start again from scratch?"""
        return fault.kind.restartable and (
            fault.kind.node_fault or member.restarts < self.lc.config.max_fresh_restarts)

    def recover(self, member: RunningMember) -> bool:
        """One recovery attempt: restore the newest checkpoint on the training node and
        copy the weights to the rollout nodes (nothing learned yet: start afresh)."""
        now = self.lc.clock.now()
        if now < member.retry_at_s:
            return False
        why = member.given_up(self.lc.config, now)
        if why is not None:
            self._give_up(member, why)
            return True
        if not member.initialised:
            return self._restart(member)
        member.recoveries += 1
        job_id = member.spec.job_id
        gang = training_gang(member)
        gang.stop(self.lc.link)        # a gang is formed again: new workers, a new world
        try:
            self.lc.register(member)   # a restarted node daemon may have lost it
        except WeaveError as exc:
            log.info("register of %s before its restore: %s", job_id, exc)
        try:
            self.lc.link.call(member.train_node, Op.RESTORE, job=job_id)
            info = self.lc.link.call(member.train_node, Op.ATTACH_INFO, job=job_id)
            member.version = int(info["segments"][contract.STATE]["index"]["version"])
            member.version_known = True
            gang.restore_ranks(self.lc.link, member.version)   # rank 0's is the manifest
            self.lc.mover.transfer.forget(member.job)   # versions start over from the checkpoint
            self.restore_weights(member, info)
        except NoCheckpoint as exc:   # not transient: no retry can find one
            if member.restarts < self.lc.config.max_fresh_restarts:
                return self._restart(member, "weaved restarted before its first checkpoint")
            member.error = f"recovery {member.recoveries}: {exc}"
            self._give_up(member, member.error)
            return True
        except WeaveError as exc:
            self._retry_later(member, Fault.from_error(exc, member.train_node.name),
                              f"recovery {member.recoveries}: {exc}")
            return False
        member.node_fault_since = None
        del member.rewards[member.version:]
        member.rolled = member.delivered = member.version
        if member.versions is not None:
            member.versions.rewind(member.version)
        member.next_kind = Phase.ROLLOUT
        member.outcome = (f"re-admitted from checkpoint v{member.version} "
                          f"(recovery {member.recoveries})")
        self.lc.move(member, MemberState.READY, member.outcome)
        if member.version >= member.spec.steps:   # its last checkpoint was its final step
            self.lc.move(member, MemberState.DONE, f"reached version {member.version}")
        return True

    def _restart(self, member: RunningMember, cause: str | None = None) -> bool:
        """Start a member with nothing learned again from scratch: drop what it left on
        its nodes (a node that does not answer is waited for). ``cause``: why, when it
        is not the fault that sent it here. A restart spends ``max_fresh_restarts``
        unless a node caused it."""
        job_id = member.spec.job_id
        for node in member_nodes(member):
            try:
                self.lc.link.call(node, Op.DROP, job=job_id)
            except WeaveError as exc:
                fault = Fault.from_error(exc, node.name)
                if fault.kind.node_fault:   # it may hold what is to be dropped: wait
                    self._retry_later(member, fault, f"restart of {job_id}: {exc}")
                    return False
                log.info("drop of %s on %s before its restart: %s", job_id, node.name, exc)
        for gang in Lifecycle.ranks(member):
            gang.drop(self.lc.link)
        by_node = cause is None and member.fault is not None and member.fault.kind.node_fault
        restarts = member.restarts if by_node else member.restarts + 1
        words = cause or (member.fault.words() if member.fault else member.error or "")
        note = (f"{words} during its first phase; restarted from scratch (no checkpoint "
                f"yet, restart {restarts})")
        log.warning("job %s: %s", job_id, note)
        self.lc.mover.transfer.forget(member.job)
        member.start_over(note, restarts)
        if member.versions is not None:
            member.versions.rewind(0)
        self.lc.profiler.forget(job_id)
        self.lc.profiler.track(job_id, member.spec.declared)
        self.lc.move(member, MemberState.STARTING, note)
        return True

    def _retry_later(self, member: RunningMember, fault: Fault, words: str) -> None:
        member.error = words
        member.charge(fault.kind.node_fault, self.lc.clock.now())
        member.retry_at_s = self.lc.clock.now() + member.backoff_s(self.lc.config)
        log.warning("member %s: %s", member.spec.job_id, words)

    def _give_up(self, member: RunningMember, why: str) -> None:
        if member.fault is not None:
            member.outcome = "gave up"
        self.lc.move(member, MemberState.FAILED, why)

    def restore_weights(self, member: RunningMember, info: Mapping[str, Any]) -> None:
        """Rollout nodes get the restored weights (k >= 1: every version a replay needs)."""
        k = member.staleness
        if k == 0:
            self.lc.mover.copy(member, contract.WEIGHTS, member.train_node, member.rollout_nodes,
                            "weights")
            return
        for version in range(rollout_version(member.version, k), member.version + 1):
            buf = buffer_name(WEIGHTS_BUFFER, version, k)
            held = dict(info["segments"].get(buf) or {}).get("index", {}).get("version")
            if held != version:
                raise StateError(f"member {member.spec.job_id}: its checkpoint's buffer "
                                 f"{buf} holds version {held!r}; the replay needs v{version}")
            self.lc.mover.copy(member, buf, member.train_node, member.rollout_nodes, "weights",
                            buf)
