"""A member's life cycle in its group: join, adopt, leave, hand off, detach.

:class:`Lifecycle` is the one owner of every member's state: each change goes through
:meth:`Lifecycle.move` and the transition table (:data:`~weave_slurm.runtime.group.TRANSITIONS`),
and is recorded as an event in its outbox (:class:`~weave_slurm.runtime.port_events.Outbox`)
before anyone acts on it. The group runner calls it when it starts or ends a phase;
weaved reaches it only through the port's commands (:mod:`~weave_slurm.runtime.port`).

Its neighbours own the two other concerns of a member's life, each through this
class's public API: recovery after a fault (:mod:`~weave_slurm.runtime.recovery`) and
the group's changing rollout nodes, re-layout and re-pin
(:mod:`~weave_slurm.runtime.relayout`).

A member joins fresh, or is adopted with the warm state a previous weaved or a lost
training node left (its checkpoint carried over when it comes from another node); it
is then re-admitted by recovery. A member a re-plan moves to another group is handed
off at its step boundary (:meth:`Lifecycle.hand_offs`); a group that lost nodes is
detached, each member's way on decided by :func:`~weave_slurm.runtime.resume.plan_detach`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from weave_slurm.clock import Clock
from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.hosted import contract
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.copies import Mover
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.gang import Gang
from weave_slurm.runtime.group import TRANSITIONS, GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.member import NodeSlots, PhaseRun, RunnerConfig, RunningMember
from weave_slurm.runtime.nodes import NodeLink
from weave_slurm.runtime.ordering import turn_slots
from weave_slurm.runtime.port_events import Outbox
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.resume import (
    Resume,
    ResumeKind,
    forget_checkpoints,
    handoff_resume,
    plan_detach,
)
from weave_slurm.runtime.staleness import VersionLog

log = logging.getLogger(__name__)
#: States of a member taking part in the cycle (one in any other is passed over).
_CYCLING = frozenset({MemberState.READY, MemberState.ROLLOUT, MemberState.TRAIN})

#: States of a member whose life in the group is over.
ENDED = (MemberState.DONE, MemberState.FAILED, MemberState.CANCELLED)


class Lifecycle:
    """The members of one group and every change of their state."""

    def __init__(self, layout: GroupLayout, *, link: NodeLink, mover: Mover,
                 slots: NodeSlots, profiler: LiveProfiler, clock: Clock,
                 config: RunnerConfig) -> None:
        self.layout, self.link, self.mover, self.slots = layout, link, mover, slots
        self.profiler, self.clock, self.config = profiler, clock, config
        self.members: dict[str, RunningMember] = {}
        self.order: list[str] = []
        self.outbox = Outbox()   # every change, in order, until the port drains it

    # -- the one door for state changes ----------------------------------------------
    def move(self, member: RunningMember, to: MemberState, why: str) -> None:
        if to not in TRANSITIONS[member.state]:
            raise StateError(f"member {member.spec.job_id}: {member.state.value} -> "
                             f"{to.value} is not a valid transition ({why})")
        member.history.append((self.clock.now(), to, why))
        member.state = to
        if to is MemberState.READY:
            member.ready_s = self.clock.now()
        self.outbox.changed(member.spec.job_id, to, why, self.clock.now(), member.fault)

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
                        self.layout.train[spec.train_node], spec.rollout_nodes_in(self.layout),
                        recoveries=spec.recoveries)
        # a cooperative job's processes are its own: one gated process per role
        whole = self.config.gangs and spec.launch is None
        member.gang = Gang.of(spec, member.job, self.layout.train, whole=whole)
        self.set_engines(member, whole)
        if spec.colocated and member.gang.size > 1:
            raise ConfigError(f"member {spec.job_id!r}: co-located with {member.gang.size} "
                              "training ranks: not supported yet (one resident worker "
                              "switches between its two roles); valid: one rank and one "
                              "engine, or the site's [runtime] gangs = false")
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
        warm = resume.version if resume is not None and resume.kind is ResumeKind.WARM \
            else None
        if warm is not None and (info is None or warm > 0):
            # its training node kept what it learned, but did not answer now, or (having
            # learned something: a version past 0) listed no state at this moment:
            # recovery restores it once it does (waiting for the node) or says why it
            # cannot, never a silent fresh start that drops what it learned (its ITER
            # going back to 0)
            held = True
        if not held and resume is not None and resume.kind is ResumeKind.CARRIED:
            held = self._move_checkpoint(member, resume)
            if not held:
                member.restart_note = ("its training node was lost and its last checkpoint "
                                       "could not be moved to the new one; restarted from "
                                       "scratch")
        if held:
            why = resume.readmit if resume is not None and resume.readmit \
                else "re-attached after a weaved restart"
            for node in member_nodes(member):   # stop what a previous weaved left running
                self.link.best_effort(node, Op.DEACTIVATE, job=spec.job_id)
            member.initialised, member.version_known = True, False
            member.fault, member.outcome = Fault(FaultKind.REATTACHED, evidence=why), None
            self.move(member, MemberState.RECOVERING, why)
        elif info is not None:
            # no warm state yet, but a previous weaved may have left its first phase
            # running: drop it (worker killed, whatever it had written removed)
            for node in member_nodes(member):
                self.link.best_effort(node, Op.DROP, job=spec.job_id)
            for gang in self.ranks(member):
                gang.drop(self.link)
        return member

    def _move_checkpoint(self, member: RunningMember, resume: Resume) -> bool:
        """The member's last checkpoint from its lost training node's root to its new
        training node; True when it can be restored there."""
        root = resume.root
        assert root is not None
        gang = training_gang(member)     # a gang's ranks 1.. come with rank 0 (their roots)
        moves = [(gang.lead, root), *zip(gang.others, resume.rank_roots, strict=False)]
        if len(moves) < gang.size:
            member.warn("no checkpoint roots of its ranks 1.. were kept: it cannot be "
                        "restored on its new training node")
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
                member.warn(f"its checkpoint under {old} could not be moved to "
                            f"{slot.node.name}: {exc}")
                return False
            log.info("job %s: checkpoint %s moved to %s (%s)", slot.job.job_id,
                     info.get("versions"), slot.node.name, info.get("path"))
        return True

    def leave(self, job_id: str) -> None:
        """Cancel a member: stop its phase, drop its state, workers and checkpoints (a
        training node that cannot drop them, e.g. lost just as the member ended: removed
        from its root on the shared file system, :func:`forget_checkpoints`)."""
        member = self.member(job_id)
        for run in list(member.runs.values()):
            self.release(member, run)
        unreached = [node for node in member_nodes(member)   # unregistered there, or gone
                     if self.link.best_effort(node, Op.DROP, job=job_id) is None]
        if member.state is not MemberState.MOVED:   # a moved one's go to its new group
            forget_checkpoints(member, self.config.checkpoint_base,
                               [n for n in unreached if n == member.train_node])
        for gang in self.ranks(member):
            gang.drop(self.link)
        self.mover.transfer.forget(member.job)
        self.move(member, MemberState.CANCELLED, "left the group")
        self.order.remove(job_id)
        self.profiler.forget(job_id)

    def register(self, member: RunningMember) -> None:
        """Register the member on each of its nodes (its owner's uid, its workers)."""
        owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
        for node in member_nodes(member):
            self.link.call(node, Op.REGISTER, job=member.spec.job_id, checkpoint_interval_s=0,
                           **owner)
        for gang in self.ranks(member):
            gang.register(self.link, owner)

    def release(self, member: RunningMember, run: PhaseRun) -> None:
        """The member no longer runs ``run``: its nodes are free."""
        member.runs.pop(run.kind, None)
        self.slots.free_run(member.spec.job_id, run)

    def set_engines(self, member: RunningMember, whole: bool) -> None:
        """The member's rollout engines on its pins, when its layout (or its pool) has
        several (a co-located member has one, in its one worker on its training node)."""
        spec = member.spec
        engines = None if spec.colocated else \
            Gang.engines_of(spec, member.job, self.layout.rollout)
        member.engines = engines if whole and engines is not None and engines.size > 1 \
            else None
        if spec.pool is not None and not whole and engines is not None and engines.size > 1:
            raise ConfigError(f"member {spec.job_id!r}: pooled over {engines.size} engines "
                              "on a runtime that starts one process a member; valid: the "
                              "site's [runtime] gangs = true")
        if spec.colocated and whole and spec.layout is not None \
                and spec.layout.rollout.engines > 1:
            raise ConfigError(f"member {spec.job_id!r}: co-located with "
                              f"{spec.layout.rollout.engines} rollout engines: not supported "
                              "yet; valid: one engine, or the site's [runtime] gangs = false")

    @staticmethod
    def ranks(member: RunningMember) -> tuple[Gang, ...]:
        """Its training gang and its rollout engines (their node-level jobs)."""
        return (training_gang(member), *((member.engines,) if member.engines else ()))

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
        if member.state not in (*ENDED, MemberState.MOVED) and not member.handoff:
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
                    training_gang(member).checkpoint(self.link)
                except WeaveError as exc:   # its newest earlier checkpoint goes instead
                    member.warn(f"no checkpoint of its newest step before its move "
                                f"({exc}); its newest earlier checkpoint goes instead")
            resume = handoff_resume(member, checkpoint_base, source)
            self.move(member, MemberState.MOVED, resume.why)
            out[member.spec.job_id] = resume
        return out

    @property
    def finished(self) -> bool:
        return all(m.state in ENDED for m in self.members.values())

    def nodes_in_use(self) -> set[str]:
        """The nodes a member not yet gone is on, moving to or runs a phase on."""
        return {n.name for m in self.members.values() if m.state is not MemberState.CANCELLED
                for n in (m.train_node, *m.rollout_nodes, *(m.repin or ()),
                          *(r.node for r in m.runs.values()))}


def training_gang(member: RunningMember) -> Gang:
    """The member's training ranks (set when it joins)."""
    assert member.gang is not None, "a member's gang is set when it joins"
    return member.gang


def member_nodes(member: RunningMember) -> tuple[NodeRef, ...]:
    """Its training node and its rollout nodes (a co-located member's one node once)."""
    return tuple(dict.fromkeys((member.train_node, *member.rollout_nodes)))
