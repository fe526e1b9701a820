"""The group's rollout nodes change while it runs: re-layout and re-pin.

The group's rollout nodes may change while it runs (:meth:`Relayout.change`: nodes
added by rollout scaling, nodes retired after a shrink); every member keeps its nodes,
its pins renumbered to their places in the new layout. A member the plan moves to
other rollout nodes (:meth:`Relayout.repin`) starts no rollout until its phases in
flight have ended; then its warm rollout state is copied from its training node to
the new nodes and dropped on those it left, and it goes on from there without losing a
step (:meth:`Relayout.carry`). A copy that fails sends the member to recovery, which
restores its checkpoint onto the new nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.hosted import contract
from weave_slurm.hosted.contract import WEIGHTS_BUFFER, buffer_name, rollout_version
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault
from weave_slurm.runtime.gang import RankSlot
from weave_slurm.runtime.group import GroupLayout, MemberState, NodeRef
from weave_slurm.runtime.lifecycle import ENDED, Lifecycle
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.recovery import Recovery

log = logging.getLogger(__name__)


class Relayout:
    """The layout of ``lifecycle``'s group and its members' pins (see module doc)."""

    def __init__(self, lifecycle: Lifecycle, recovery: Recovery) -> None:
        self.lc, self.recovery = lifecycle, recovery

    def change(self, layout: GroupLayout) -> None:
        """The group runs on ``layout`` from now on (rollout nodes added or retired):
        every member keeps its nodes, its pins renumbered to their places in it."""
        layout.validate()
        index = {n.name: i for i, n in enumerate(layout.rollout)}
        # a co-located member's rollout node is its training node: no pins to renumber
        live = [m for m in self.lc.members.values()
                if m.state is not MemberState.CANCELLED and not m.spec.colocated]
        gone = sorted({n.name for m in live for n in (*m.rollout_nodes, *(m.repin or ()))
                       if n.name not in index})
        if gone:
            raise StateError(f"group layout: rollout node(s) {', '.join(gone)} still serve "
                             "a member; re-pin it first")
        self.lc.layout = layout
        for m in live:
            m.spec = replace(m.spec, rollout_pins=tuple(index[n.name] for n in m.rollout_nodes))

    def repin(self, member: RunningMember, pins: Sequence[int],
              pool: Sequence[int] | None = None) -> None:
        """Move the member's rollouts to the layout's rollout nodes ``pins`` at its next
        phase boundary (see module doc), pooled over ``pool`` GPUs on them (a width
        change: ``runtime/pool.py``; None: not pooled, its layout's engines); the same
        nodes and pool: nothing to do. A co-located member rolls out on its training
        node, and is not re-pinned. A re-pin its spec refuses (the plan and the member
        disagree) leaves it where it is and is its warning (``weave status``'s REASON),
        not an error each time weaved asks again."""
        if member.spec.colocated:
            raise ConfigError(f"re-pin of {member.spec.job_id!r} to rollout nodes "
                              f"{list(pins)!r}: it is co-located (its rollout runs on its "
                              f"training node {member.train_node.name}); valid: none")
        want = None if pool is None else tuple(pool)
        try:
            replace(member.spec, rollout_pins=tuple(pins), pool=want).validate(
                len(self.lc.layout.rollout), len(self.lc.layout.train))
        except ConfigError as exc:   # weaved asks again each tick: said once, in words
            words = (f"its plan's re-pin to rollout nodes {list(pins)!r} was refused: "
                     f"{exc}; it rolls out where it is")
            if member.warning != words:
                member.warn(words)
            return
        nodes = tuple(self.lc.layout.rollout[p] for p in pins)
        same = nodes == member.rollout_nodes and want == member.spec.pool
        member.repin, member.repool = (None, None) if same else (nodes, want)
        if member.repin is not None:
            width = "" if want is None else f" (pool {'+'.join(map(str, want))} GPUs)"
            log.info("job %s: re-pinned to %s%s; moving once its phases in flight end",
                     member.spec.job_id, ", ".join(n.name for n in nodes), width)

    def carry(self) -> bool:
        """Move every re-pinned member that has no phase in flight; True if any moved."""
        moved = False
        for member in list(self.lc.members.values()):
            if member.repin is None or member.runs or member.deferred:
                continue
            if member.state in ENDED:
                member.repin = member.repool = None
                continue
            self._move_rollout(member, member.repin)
            moved = True
        return moved

    def _move_rollout(self, member: RunningMember, new: tuple[NodeRef, ...]) -> None:
        job_id, old = member.spec.job_id, member.rollout_nodes
        index = {n.name: i for i, n in enumerate(self.lc.layout.rollout)}
        member.repin, member.rollout_nodes = None, new
        member.spec = replace(member.spec, rollout_pins=tuple(index[n.name] for n in new),
                              pool=member.repool)
        member.repool = None
        fresh = self._move_engines(member)
        for node in old:
            if node not in new:   # its rollout state there (its checkpoints are on its
                self.lc.link.best_effort(node, Op.DROP, job=job_id)   # training node)
        added = [n for n in new if n not in old]
        log.info("job %s: rollout moved from %s to %s (%d engine(s))", job_id,
                 ", ".join(n.name for n in old), ", ".join(n.name for n in new),
                 1 if member.engines is None else member.engines.size)
        if member.state is not MemberState.READY:
            return   # nothing warm to move: its first phase or its recovery puts it there
        owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
        if added:   # a node it comes back to takes any version
            self.lc.mover.transfer.forget(member.job)
        try:
            for node in added:
                self.lc.link.call(node, Op.REGISTER, job=job_id, checkpoint_interval_s=0, **owner)
            for slot in fresh:   # more engines on nodes it had: registered, nothing copied
                self.lc.link.call(slot.node, Op.REGISTER, job=slot.job.job_id,
                                  checkpoint_interval_s=0, **owner)
            if added:
                self._copy_rollout_state(member, added)
        except WeaveError as exc:   # recovery restores its checkpoint onto the new nodes
            where = ",".join(n.name for n in added) or ",".join(s.node.name for s in fresh)
            self.recovery.fail(member, Fault.from_error(exc, where,
                                                        during="moving its rollout state"))

    def _move_engines(self, member: RunningMember) -> list[RankSlot]:
        """The member's engines follow its pins and pool: an engine job no longer placed
        where it was is dropped there; the new ones are returned (to register)."""
        def placed() -> dict[tuple[str, str], RankSlot]:
            others = member.engines.others if member.engines is not None else ()
            return {(s.job.job_id, s.node.name): s for s in others}
        old = placed()
        self.lc.set_engines(member, self.lc.config.gangs and member.spec.launch is None)
        new = placed()
        for key, slot in old.items():
            if key not in new:
                self.lc.link.best_effort(slot.node, Op.DROP, job=slot.job.job_id)
        return [slot for key, slot in new.items() if key not in old]

    def _copy_rollout_state(self, member: RunningMember, nodes: Sequence[NodeRef]) -> None:
        """What the member's next rollouts read, from its training node to ``nodes``: its
        weights (a stale member: the ring buffers of every version they may read)."""
        k = member.staleness
        if k == 0:
            self.lc.mover.copy(member, contract.WEIGHTS, member.train_node, nodes, "weights")
            return
        for version in range(rollout_version(member.rolled, k), member.version + 1):
            buf = buffer_name(WEIGHTS_BUFFER, version, k)
            self.lc.mover.copy(member, buf, member.train_node, nodes, "weights", buf)
