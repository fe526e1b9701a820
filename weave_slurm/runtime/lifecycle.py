"""A member's life cycle in its group: join, adopt, leave, fail, recover, restart, detach,
and re-pin when the group's rollout nodes change.

:class:`Lifecycle` is the one owner of every member's state: each change goes through
:meth:`Lifecycle.move` and the transition table (:data:`~weave_slurm.runtime.group.TRANSITIONS`).
The group runner calls it when it starts, ends or loses a phase; weaved's group
runtime calls the public API through the runner.

Recovery decides on a fault's type (:class:`~weave_slurm.runtime.faults.Fault`), never
on its words. A failure touches only its member: what it runs is stopped, and it is
re-admitted from the newest checkpoint on its training node (weights copied to its
rollout nodes) while the others keep running. Its own faults spend the budget
``max_recoveries``; a node that is gone or stopping is waited for up to ``node_wait_s``
(:meth:`~weave_slurm.runtime.member.Member.charge`). A member with nothing learned yet
(killed in its first phase, or adopted before its first checkpoint) starts again from
scratch, at most ``max_fresh_restarts`` times for faults of its own.

The group's rollout nodes may change while it runs (:meth:`Lifecycle.relayout`: nodes
added by rollout scaling, nodes retired after a shrink); every member keeps its nodes.
A member the plan moves to other rollout nodes (:meth:`Lifecycle.repin`) starts no
rollout until its phases in flight have ended; then its warm rollout state is copied
from its training node to the new nodes and dropped on those it left, and it goes on
from there without losing a step (:meth:`Lifecycle.carry_repins`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from weave_slurm.clock import Clock
from weave_slurm.errors import ConfigError, NoCheckpoint, StateError, WeaveError
from weave_slurm.hosted import contract
from weave_slurm.hosted.contract import WEIGHTS_BUFFER, buffer_name, rollout_version
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.gang import Gang
from weave_slurm.runtime.group import TRANSITIONS, GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.member import NodeSlots, PhaseRun, RunnerConfig, RunningMember
from weave_slurm.runtime.moves import Mover
from weave_slurm.runtime.nodes import NodeLink
from weave_slurm.runtime.ordering import turn_slots
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.resume import Resume, ResumeKind, handoff_resume, plan_detach
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)
#: States of a member taking part in the cycle (one in any other is passed over).
_CYCLING = frozenset({MemberState.READY, MemberState.ROLLOUT, MemberState.TRAIN})

_ENDED = (MemberState.DONE, MemberState.FAILED, MemberState.CANCELLED)


class Lifecycle:
    """The members of one group and every change of their state."""

    def __init__(self, layout: GroupLayout, *, link: NodeLink, mover: Mover,
                 slots: NodeSlots, profiler: LiveProfiler, clock: Clock,
                 config: RunnerConfig, spans: list[Span]) -> None:
        self.layout, self.link, self.mover, self.slots = layout, link, mover, slots
        self.profiler, self.clock, self.config, self.spans = profiler, clock, config, spans
        self.members: dict[str, RunningMember] = {}
        self.order: list[str] = []
        self.listeners: list[Callable[[RunningMember, str], None]] = []

    # -- the one door for state changes ----------------------------------------------
    def move(self, member: RunningMember, to: MemberState, why: str) -> None:
        if to not in TRANSITIONS[member.state]:
            raise StateError(f"member {member.spec.job_id}: {member.state.value} -> "
                             f"{to.value} is not a valid transition ({why})")
        member.history.append((self.clock.now(), to, why))
        member.state = to
        if to is MemberState.READY:
            member.ready_s = self.clock.now()
        for listener in self.listeners:
            listener(member, why)

    @property
    def turn_order(self) -> tuple[str, ...]:
        """The cyclic order of the members' turns (runtime/ordering.turn_slots)."""
        return turn_slots(self.order, [self.members[j].spec.turns for j in self.order])

    def cycling(self) -> set[str] | None:
        """When members take turns, training keeps to the turn order placement planned:
        the members taking part in the cycle (a training node waits for the next turn's
        member among them, passing over the others). None: work-conserving."""
        if all(m.spec.turns == 1 for m in self.members.values()):
            return None
        return {j for j, m in self.members.items() if m.state in _CYCLING}

    def set_turns(self, job_id: str, turns: int) -> None:
        """A member's steps per round, as placement re-planned them."""
        member = self.member(job_id)
        spec = replace(member.spec, turns=turns)
        spec.validate(len(self.layout.rollout), len(self.layout.train))
        member.spec = spec

    def member(self, job_id: str) -> RunningMember:
        if job_id not in self.members:
            raise ConfigError(f"no member {job_id!r} in this group "
                              f"(members: {', '.join(self.order) or 'none'})")
        return self.members[job_id]

    # -- membership ------------------------------------------------------------------
    def join(self, spec: MemberSpec) -> RunningMember:
        """Add a fresh member at the end of the cyclic order; its state is put on first use."""
        if spec.job_id in self.members and \
                self.members[spec.job_id].state is not MemberState.CANCELLED:
            raise ConfigError(f"member {spec.job_id!r} is already in the group")
        spec.validate(len(self.layout.rollout), len(self.layout.train))
        member = RunningMember(spec, JobRef(spec.job_id, spec.owner_uid()),
                        self.layout.train[spec.train_node],
                        tuple(self.layout.rollout[p] for p in spec.rollout_pins))
        # a cooperative job's processes are its own: one gated process per role
        whole = self.config.gangs and spec.launch is None
        member.gang = Gang.of(spec, member.job, self.layout.train, whole=whole)
        self._engines(member, whole)
        member.history.append((self.clock.now(), MemberState.STARTING, "joined"))
        records = self.config.records_dir
        member.versions = VersionLog(spec.job_id, spec.staleness, None if records is None
                                     else Path(records) / f"{spec.job_id}.versions.jsonl")
        self.members[spec.job_id] = member
        self.order = [j for j in self.order if j != spec.job_id] + [spec.job_id]
        self.profiler.track(spec.job_id, spec.declared)
        return member

    def adopt(self, spec: MemberSpec, resume: Resume | None = None) -> RunningMember:
        """Join a member that may have warm state on its nodes already: a previous
        weaved's, or a lost training node's checkpoint (``resume``, from
        :meth:`detach`). With its state found it is re-admitted from its newest
        checkpoint; otherwise it starts fresh from nothing (leftovers dropped)."""
        member = self.join(spec)
        if resume is not None and resume.kind is ResumeKind.FRESH:
            member.restart_note = resume.note
        info = self.link.best_effort(member.train_node, Op.ATTACH_INFO, job=spec.job_id)
        held = info is not None and contract.STATE in dict(info.get("segments") or {})
        if not held and resume is not None and resume.kind is ResumeKind.CARRIED:
            held = self._move_checkpoint(member, resume)
            if not held:
                member.restart_note = ("its training node was lost and its last checkpoint "
                                       "could not be moved to the new one; restarted from "
                                       "scratch")
        if held:
            why = resume.readmit if resume is not None and resume.readmit \
                else "re-attached after a weaved restart"
            for node in self._nodes(member):   # stop what a previous weaved left running
                self.link.best_effort(node, Op.DEACTIVATE, job=spec.job_id)
            member.initialised = True
            member.fault, member.outcome = Fault(FaultKind.REATTACHED, evidence=why), None
            self.move(member, MemberState.RECOVERING, why)
        elif info is not None:
            # no warm state yet, but a previous weaved may have left its first phase
            # running: drop it (worker killed, whatever it had written removed)
            for node in self._nodes(member):
                self.link.best_effort(node, Op.DROP, job=spec.job_id)
            for gang in self._ranks(member):
                gang.drop(self.link)
        return member

    def _move_checkpoint(self, member: RunningMember, resume: Resume) -> bool:
        """The member's last checkpoint from its lost training node's root to its new
        training node; True when it can be restored there."""
        root = resume.root
        assert root is not None
        gang = self._gang(member)     # a gang's ranks 1.. come with rank 0 (their roots)
        moves = [(gang.lead, root), *zip(gang.others, resume.rank_roots, strict=False)]
        if len(moves) < gang.size:
            log.warning("job %s: no checkpoint roots of its ranks 1.. were kept",
                        member.spec.job_id)
            return False
        for slot, old in moves:
            if old.name == slot.node.name:
                continue   # the same node came back: its checkpoints are where they were
            try:
                self.link.call(slot.node, Op.REGISTER, job=slot.job.job_id, uid=slot.job.uid,
                               checkpoint_interval_s=0)
                info = self.link.call(slot.node, Op.ADOPT, job=slot.job.job_id,
                                      from_root=str(old))
            except (WeaveError, OSError) as exc:
                log.warning("job %s: its checkpoint under %s could not be moved to %s: %s",
                            slot.job.job_id, old, slot.node.name, exc)
                return False
            log.info("job %s: checkpoint %s moved to %s (%s)", slot.job.job_id,
                     info.get("versions"), slot.node.name, info.get("path"))
        return True

    def leave(self, job_id: str) -> None:
        """Cancel a member: stop its phase, drop its state, workers and checkpoints."""
        member = self.member(job_id)
        for run in list(member.runs.values()):
            self.release(member, run)
        for node in self._nodes(member):   # unregistered there, or the node is gone
            self.link.best_effort(node, Op.DROP, job=job_id)
        for gang in self._ranks(member):
            gang.drop(self.link)
        self.mover.transfer.forget(member.job)
        self.move(member, MemberState.CANCELLED, "left the group")
        self.order.remove(job_id)
        self.profiler.forget(job_id)

    def register(self, member: RunningMember) -> None:
        """Register the member on each of its nodes (its owner's uid, its workers)."""
        owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
        for node in self._nodes(member):
            self.link.call(node, Op.REGISTER, job=member.spec.job_id, checkpoint_interval_s=0,
                           **owner)
        for gang in self._ranks(member):
            gang.register(self.link, owner)

    def release(self, member: RunningMember, run: PhaseRun) -> None:
        """The member no longer runs ``run``: its nodes are free."""
        member.runs.pop(run.kind, None)
        self.slots.free_run(member.spec.job_id, run)

    def _engines(self, member: RunningMember, whole: bool) -> None:
        """The member's rollout engines on its pins, when its layout has several."""
        engines = Gang.engines_of(member.spec, member.job, self.layout.rollout)
        member.engines = engines if whole and engines.size > 1 else None

    def _ranks(self, member: RunningMember) -> tuple[Gang, ...]:
        """Its training gang and its rollout engines (their node-level jobs)."""
        return (self._gang(member), *((member.engines,) if member.engines else ()))

    @staticmethod
    def _gang(member: RunningMember) -> Gang:
        assert member.gang is not None, "a member's gang is set when it joins"
        return member.gang

    @staticmethod
    def _nodes(member: RunningMember) -> tuple[NodeRef, ...]:
        return (member.train_node, *member.rollout_nodes)

    # -- faults ----------------------------------------------------------------------
    def fail(self, member: RunningMember, fault: Fault) -> None:
        """Only this member: stop what it runs, then re-admit it (see module doc)."""
        words = fault.words()
        log.warning("member %s failed: %s", member.spec.job_id, words)
        member.charge(fault.kind.node_fault, self.clock.now())
        for run in list(member.runs.values()):
            if not run.ended:
                self.spans.append(Span(member.spec.job_id, run.kind, run.node.name,
                                       run.node.pool, run.start_s, self.clock.now(),
                                       ok=False))
                member.gang_of(run.kind, run.node).deactivate(self.link)   # every rank
            self.release(member, run)
        member.deferred.clear()
        member.error = words
        if member.state is MemberState.STARTING:
            if not self._restartable(member, fault):
                self.move(member, MemberState.FAILED, words)
                return
        elif member.state is MemberState.RECOVERING:
            return
        member.fault, member.outcome = fault, None
        self.move(member, MemberState.RECOVERING, words)

    def _restartable(self, member: RunningMember, fault: Fault) -> bool:
        """May a member that failed in its first phase start again from scratch?"""
        return fault.kind.restartable and (
            fault.kind.node_fault or member.restarts < self.config.max_fresh_restarts)

    def recover(self, member: RunningMember) -> bool:
        """One recovery attempt: restore the newest checkpoint on the training node and
        copy the weights to the rollout nodes (nothing learned yet: start afresh)."""
        now = self.clock.now()
        if now < member.retry_at_s:
            return False
        why = member.given_up(self.config, now)
        if why is not None:
            self._give_up(member, why)
            return True
        if not member.initialised:
            return self._restart(member)
        member.recoveries += 1
        job_id = member.spec.job_id
        gang = self._gang(member)
        gang.stop(self.link)        # a gang is formed again: new workers, a new world
        try:
            self.register(member)   # a restarted node daemon may have lost it
        except WeaveError as exc:
            log.info("register of %s before its restore: %s", job_id, exc)
        try:
            self.link.call(member.train_node, Op.RESTORE, job=job_id)
            info = self.link.call(member.train_node, Op.ATTACH_INFO, job=job_id)
            member.version = int(info["segments"][contract.STATE]["index"]["version"])
            gang.restore_ranks(self.link, member.version)   # rank 0's is the manifest
            self.mover.transfer.forget(member.job)   # versions start over from the checkpoint
            self.restore_weights(member, info)
        except NoCheckpoint as exc:   # not transient: no retry can find one
            if member.restarts < self.config.max_fresh_restarts:
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
        self.move(member, MemberState.READY, member.outcome)
        if member.version >= member.spec.steps:   # its last checkpoint was its final step
            self.move(member, MemberState.DONE, f"reached version {member.version}")
        return True

    def _restart(self, member: RunningMember, cause: str | None = None) -> bool:
        """Start a member with nothing learned again from scratch: drop what it left on
        its nodes (a node that does not answer is waited for). ``cause``: why, when it
        is not the fault that sent it here. A restart spends ``max_fresh_restarts``
        unless a node caused it."""
        job_id = member.spec.job_id
        for node in self._nodes(member):
            try:
                self.link.call(node, Op.DROP, job=job_id)
            except WeaveError as exc:
                fault = Fault.from_error(exc, node.name)
                if fault.kind.node_fault:   # it may hold what is to be dropped: wait
                    self._retry_later(member, fault, f"restart of {job_id}: {exc}")
                    return False
                log.info("drop of %s on %s before its restart: %s", job_id, node.name, exc)
        for gang in self._ranks(member):
            gang.drop(self.link)
        by_node = cause is None and member.fault is not None and member.fault.kind.node_fault
        restarts = member.restarts if by_node else member.restarts + 1
        words = cause or (member.fault.words() if member.fault else member.error or "")
        note = (f"{words} during its first phase; restarted from scratch (no checkpoint "
                f"yet, restart {restarts})")
        log.warning("job %s: %s", job_id, note)
        self.mover.transfer.forget(member.job)
        member.start_over(note, restarts)
        if member.versions is not None:
            member.versions.rewind(0)
        self.profiler.forget(job_id)
        self.profiler.track(job_id, member.spec.declared)
        self.move(member, MemberState.STARTING, note)
        return True

    def _retry_later(self, member: RunningMember, fault: Fault, words: str) -> None:
        member.error = words
        member.charge(fault.kind.node_fault, self.clock.now())
        member.retry_at_s = self.clock.now() + member.backoff_s(self.config)
        log.warning("member %s: %s", member.spec.job_id, words)

    def _give_up(self, member: RunningMember, why: str) -> None:
        if member.fault is not None:
            member.outcome = "gave up"
        self.move(member, MemberState.FAILED, why)

    def restore_weights(self, member: RunningMember, info: Mapping[str, Any]) -> None:
        """Rollout nodes get the restored weights (k >= 1: every version a replay needs)."""
        k = member.staleness
        if k == 0:
            self.mover.copy(member, contract.WEIGHTS, member.train_node, member.rollout_nodes,
                            "weights")
            return
        for version in range(rollout_version(member.version, k), member.version + 1):
            buf = buffer_name(WEIGHTS_BUFFER, version, k)
            held = dict(info["segments"].get(buf) or {}).get("index", {}).get("version")
            if held != version:
                raise StateError(f"member {member.spec.job_id}: its checkpoint's buffer "
                                 f"{buf} holds version {held!r}; the replay needs v{version}")
            self.mover.copy(member, buf, member.train_node, member.rollout_nodes, "weights",
                            buf)

    # -- a group that lost nodes -----------------------------------------------------
    def detach(self, lost: Sequence[NodeRef], checkpoint_base: Path | None) -> dict[str, Resume]:
        """The group lost ``lost`` (their allocation vanished): how each member goes on
        on the group's next runner (:mod:`weave_slurm.runtime.resume`). Nothing is
        dropped: members whose training node survived keep their warm state there."""
        return plan_detach([self.members[k] for k in self.order], lost, checkpoint_base)

    def hand_off(self, job_id: str) -> None:
        """A re-plan moves the member to another group: it finishes the step it has
        rolled out, starts nothing more, and is handed off at that boundary."""
        member = self.member(job_id)
        if member.state not in (*_ENDED, MemberState.MOVED) and not member.handoff:
            member.handoff = True
            log.info("job %s: moving to another group once its step in flight ends", job_id)

    def hand_offs(self, checkpoint_base: Path | None, source: str) -> dict[str, Resume]:
        """The members handed off now (nothing in flight): checkpointed, MOVED, and how
        each goes on in its new group (``resume.handoff_resume``)."""
        out = {}
        for member in self.members.values():
            if not member.handoff or member.runs or member.deferred or member.wants() \
                    or member.state not in (MemberState.READY, MemberState.STARTING):
                continue
            if member.initialised:
                try:   # its newest step checkpointed (checkpoint_every may have skipped it)
                    self._gang(member).checkpoint(self.link)
                except WeaveError as exc:   # its newest earlier checkpoint goes instead
                    log.warning("job %s: checkpoint before its move: %s",
                                member.spec.job_id, exc)
            resume = handoff_resume(member, checkpoint_base, source)
            self.move(member, MemberState.MOVED, resume.why)
            out[member.spec.job_id] = resume
        return out

    @property
    def finished(self) -> bool:
        return all(m.state in _ENDED for m in self.members.values())

    # -- the group's rollout nodes change --------------------------------------------
    def relayout(self, layout: GroupLayout) -> None:
        """The group runs on ``layout`` from now on (rollout nodes added or retired):
        every member keeps its nodes, its pins renumbered to their places in it."""
        layout.validate()
        index = {n.name: i for i, n in enumerate(layout.rollout)}
        live = [m for m in self.members.values() if m.state is not MemberState.CANCELLED]
        gone = sorted({n.name for m in live for n in (*m.rollout_nodes, *(m.repin or ()))
                       if n.name not in index})
        if gone:
            raise StateError(f"group layout: rollout node(s) {', '.join(gone)} still serve "
                             "a member; re-pin it first")
        self.layout = layout
        for m in live:
            m.spec = replace(m.spec, rollout_pins=tuple(index[n.name] for n in m.rollout_nodes))

    def repin(self, member: RunningMember, pins: Sequence[int]) -> None:
        """Move the member's rollouts to the layout's rollout nodes ``pins`` at its next
        phase boundary (see module doc); the same nodes: nothing to do."""
        replace(member.spec, rollout_pins=tuple(pins)).validate(len(self.layout.rollout),
                                                                 len(self.layout.train))
        nodes = tuple(self.layout.rollout[p] for p in pins)
        member.repin = None if nodes == member.rollout_nodes else nodes
        if member.repin is not None:
            log.info("job %s: re-pinned to %s; moving once its phases in flight end",
                     member.spec.job_id, ", ".join(n.name for n in nodes))

    def carry_repins(self) -> bool:
        """Move every re-pinned member that has no phase in flight; True if any moved."""
        moved = False
        for member in list(self.members.values()):
            if member.repin is None or member.runs or member.deferred:
                continue
            if member.state in _ENDED:
                member.repin = None
                continue
            self._move_rollout(member, member.repin)
            moved = True
        return moved

    def _move_rollout(self, member: RunningMember, new: tuple[NodeRef, ...]) -> None:
        job_id, old = member.spec.job_id, member.rollout_nodes
        index = {n.name: i for i, n in enumerate(self.layout.rollout)}
        member.repin, member.rollout_nodes = None, new
        member.spec = replace(member.spec, rollout_pins=tuple(index[n.name] for n in new))
        if member.engines is not None:    # the engines go with the pins
            member.engines.drop(self.link)
            self._engines(member, True)
        for node in old:
            if node not in new:   # its rollout state there (its checkpoints are on its
                self.link.best_effort(node, Op.DROP, job=job_id)   # training node)
        added = [n for n in new if n not in old]
        log.info("job %s: rollout moved from %s to %s", job_id,
                 ", ".join(n.name for n in old), ", ".join(n.name for n in new))
        if not added or member.state is not MemberState.READY:
            return   # nothing warm to move: its first phase or its recovery puts it there
        owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
        self.mover.transfer.forget(member.job)   # a node it comes back to takes any version
        try:
            for node in added:
                self.link.call(node, Op.REGISTER, job=job_id, checkpoint_interval_s=0, **owner)
            if member.engines is not None:
                member.engines.register(self.link, owner)
            self._copy_rollout_state(member, added)
        except WeaveError as exc:   # recovery restores its checkpoint onto the new nodes
            self.fail(member, Fault.from_error(exc, ",".join(n.name for n in added),
                                               during="moving its rollout state"))

    def _copy_rollout_state(self, member: RunningMember, nodes: Sequence[NodeRef]) -> None:
        """What the member's next rollouts read, from its training node to ``nodes``: its
        weights (a stale member: the ring buffers of every version they may read)."""
        k = member.staleness
        if k == 0:
            self.mover.copy(member, contract.WEIGHTS, member.train_node, nodes, "weights")
            return
        for version in range(rollout_version(member.rolled, k), member.version + 1):
            buf = buffer_name(WEIGHTS_BUFFER, version, k)
            self.mover.copy(member, buf, member.train_node, nodes, "weights", buf)

    def nodes_in_use(self) -> set[str]:
        """The nodes a member not yet gone is on, moving to or runs a phase on."""
        return {n.name for m in self.members.values() if m.state is not MemberState.CANCELLED
                for n in (m.train_node, *m.rollout_nodes, *(m.repin or ()),
                          *(r.node for r in m.runs.values()))}
