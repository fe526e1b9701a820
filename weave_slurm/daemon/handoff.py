"""A running job moved between two groups' runtimes by a re-plan (docs/daemon.md,
"Re-planning running jobs").

The reconcile loop commits a re-plan's moves to the store (:meth:`Store.commit_moves`):
a moved job's row names its new group and the group it is ``moving_from``. The group
runtime then carries the move out, one step boundary at a time:

1. once the new group's runtime holds the job's pinned nodes, the old one is told to
   hand the member off (the port's ``HandOff`` command): it trains what it has rolled
   out, starts no rollout, and at that boundary its step is checkpointed under its
   training node's root on the shared file system and it is MOVED there (``TakeHandOffs``
   reports a ``HandedOff`` event with how it goes on);
2. the new runtime adopts it with that checkpoint (``ResumeKind.CARRIED``: its new
   training node copies it in), re-admits it from it and runs it on;
3. the old runtime lets it go (``Leave``: its warm state and checkpoints there dropped)
   and the row's ``moving_from`` is cleared; its reason says where it came from.

Every step goes through the groups' ports (:mod:`weave_slurm.runtime.port`): commands
in, events and member snapshots out.

After a weaved restart between 1 and 3 no runtime holds the member any more: the new
group adopts it from the newest checkpoint under its old training node's root, which
the old group keeps while a move out of it is unfinished (the reconcile loop drains
no such group).

A move into a group that is new or grows waits at step 1 for the new nodes while the job
runs on in its old group, where it kept its place (docs/daemon.md, "Moves that wait for
nodes"); once its place goes, the old group takes the plan the re-plan gave it
(``GroupPlan.then``, applied by ``GroupPlan.without``). Once the move has waited
``move_wait_s`` (counted from its commit) it is withdrawn: the job is the old group's
member again, the old group keeps its plan as it is, the new group drops it (one left
empty before it became active drains) and its reason says why. A move that waits for its
new group's next plan (a chain) has no clock of its own meanwhile: it is withdrawn with
the move it waits for, and its clock starts once that plan is taken. A job that ends
while it waits is reported by its old group, which lets its place go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from weave_slurm.daemon.driver import pool_nodes
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import StateError, WeaveError
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Drop, HandOff, Leave, TakeHandOffs
from weave_slurm.runtime.port_events import HandedOff
from weave_slurm.runtime.resume import Resume, ResumeKind, checkpoint_version, moved_with

log = logging.getLogger(__name__)

_OUT = (MemberState.MOVED, MemberState.CANCELLED)
_ENDED = (JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED)


class Handoffs:
    """The group runtime's moves in flight (its groups' ports and resumes, shared)."""

    def __init__(self, groups: Mapping[int, GroupPort], resume: dict[int, Resume],
                 waiting: dict[int, str], checkpoint_base: Path | None,
                 wait_s: float) -> None:
        self.groups, self.resume, self.waiting = groups, resume, waiting
        self.checkpoint_base = checkpoint_base
        self.wait_s = wait_s
        self.ending: set[int] = set()   # ended before their hand-off (reported once)
        self.since: dict[int, float] = {}   # job -> when its move was committed
        # groups whose worker is busy on its nodes this tick (their ports are not in
        # ``groups``): a move out of or into one waits for a later tick
        self.busy: set[int] = set()

    def pending(self, store: Store) -> bool:
        """Whether any move is in flight (running, or ended while moving)."""
        return bool(store.jobs([JobState.RUNNING], moving=True)
                    or store.jobs(_ENDED, moving=True))

    def _touches_busy(self, job: JobRow) -> bool:
        return bool({job.moving_from, job.group_id} & self.busy)

    def hand_off(self, store: Store, placed: Callable[[JobRow], bool], now: float) -> None:
        """Start each move whose new group can take the job now (``placed``: its pinned
        nodes are in the new group's runtime), withdraw those that waited too long, and
        hand off the members at their step boundary."""
        for job in self.movers(store):
            if job.moving_from is None or job.moving_from == job.group_id:
                continue
            old = self.groups.get(job.moving_from)
            member = old.members.get(str(job.job_id)) if old is not None else None
            if member is not None and (member.state in _OUT or member.handoff):
                continue
            if job.group_id not in self.groups or not placed(job):
                chained = _waits_for_plan(store, job)
                if chained is None:   # the move it waited for was withdrawn: so is it
                    self._withdraw(store, job, now)
                    continue
                if chained:   # no clock of its own: it starts once that plan is taken
                    self.since[job.job_id] = now
                elif job.job_id not in self.since:   # a restart does not restart it
                    self.since[job.job_id] = _committed_s(store, job.job_id, now)
                if now - self.since[job.job_id] >= self.wait_s:
                    self._withdraw(store, job, now)
                    continue
                self.waiting[job.job_id] = (f"moving from group {job.moving_from} to group "
                                            f"{job.group_id}: {_waits_for(store, job)}")
                continue
            self.since.pop(job.job_id, None)
            if old is None or member is None:
                continue   # no runtime holds it (weaved restarted): the new group adopts it
            old.apply(HandOff(str(job.job_id)))
            self.waiting[job.job_id] = (f"moving from group {job.moving_from} to group "
                                        f"{job.group_id}: finishing its step in flight")
        for gid, port in self.groups.items():
            for event in port.apply(TakeHandOffs(self.checkpoint_base, f"group {gid}")):
                if isinstance(event, HandedOff):
                    self.resume[int(event.job_id)] = event.resume
                    log.info("job %s: handed off by group %s (%s)", event.job_id, gid,
                             event.resume.kind.value)

    def movers(self, store: Store) -> list[JobRow]:
        """The RUNNING jobs a re-plan is moving (but those touching a busy group)."""
        return [job for job in store.jobs([JobState.RUNNING], moving=True)
                if not self._touches_busy(job)]

    def waiting_out(self, movers: list[JobRow], group_id: int, port: GroupPort,
                    placed: Callable[[JobRow], bool]) -> list[JobRow]:
        """Of ``movers``, the jobs whose move out of ``group_id`` waits for nodes and that
        ``port``'s runtime does not hold (weaved restarted meanwhile), as rows of that group: it
        runs them on until their new group can take them (``placed``) or the move is
        withdrawn."""
        return [replace(job, group_id=group_id, moving_from=None) for job in movers
                if job.moving_from == group_id and job.group_id != group_id
                and str(job.job_id) not in port.members and job.job_id not in self.resume
                and not placed(job)]

    def _withdraw(self, store: Store, job: JobRow, now: float) -> None:
        """Take the move back: the job stays in its old group (module doc)."""
        src, dst = job.moving_from or 0, job.group_id or 0
        group = store.group(dst)
        if group is None:
            return
        plan = group.plan.without({job.job_id})
        # in its new group's plan as it is: it waited for nodes; else for that group's
        # next plan (which a withdrawal of the move it waited for may have dropped)
        waited = "the nodes it needs there were not held" if job.job_id in \
            group.plan.job_ids else f"the moves out of group {dst} it waited for were not done"
        why = (f"its move to group {dst} was withdrawn: {waited} within {self.wait_s:g} s "
               f"([runtime] move_wait_s); it runs on in group {src}")
        old = store.group(src)   # its new plan assumed the job would leave: dropped
        src_plan = replace(old.plan, then=None) if old is not None and old.plan.then else None
        try:
            store.withdraw_move(job.job_id, src, dst, plan, why, now, src_plan)
        except StateError as exc:
            log.info("job %s: %s", job.job_id, exc)
            return
        self.since.pop(job.job_id, None)
        self.waiting.pop(job.job_id, None)
        log.info("job %s: %s", job.job_id, why)
        if not plan.members and group.state is GroupState.FORMING:
            store.transition("group", dst, GroupState.DRAINING,
                             f"the move of its only member (job {job.job_id}) was withdrawn",
                             now)

    def ended(self, store: Store,
              movers: list[JobRow]) -> list[tuple[int, GroupPort, MemberView]]:
        """Members that reached their last step (or gave up) while their move was
        pending: their old group reports them (job id, its port, the member), and
        their place in its plan goes. A job whose end (a cancel, or the end reported
        here) is stored while it was moving is let go by its old group."""
        moving = {j.job_id for j in movers if j.moving_from != j.group_id}
        gone = store.jobs(_ENDED, moving=True)   # stored as ended: let go, not reported
        stored = {j.job_id for j in gone}
        out = [(int(key), port, m) for port in self.groups.values()
               for key, m in port.members.items()
               if (m.handoff or int(key) in moving) and int(key) not in stored
               and m.state in (MemberState.DONE, MemberState.FAILED)]
        self.ending.update(job_id for job_id, _, _ in out)
        for job in gone:
            if job.moving_from not in self.busy:
                self._let_go(store, job)
        return out

    def _let_go(self, store: Store, job: JobRow, reason: str | None = None) -> bool:
        """Its old group lets ``job`` go (its member, its place in the plan) and the move
        is over; True if that group's runtime held it."""
        src, key = job.moving_from or 0, str(job.job_id)
        old = self.groups.get(src)
        member = None if old is None else old.members.get(key)
        held = member is not None and member.state is not MemberState.CANCELLED
        if held:
            assert old is not None
            try:
                old.apply(Leave(key))
            except WeaveError as exc:
                words = f"warning: leaving group {src}: {exc}"
                log.warning("job %s: %s", key, words)
                reason = f"{reason}; {words}" if reason else words
        self.since.pop(job.job_id, None)
        self.waiting.pop(job.job_id, None)
        _drop_place(store, src, job.job_id)
        store.update("job", job.job_id, moving_from=None,
                     **({} if reason is None else {"reason": reason}))
        return held

    def ready(self, store: Store, job: JobRow) -> bool:
        """Whether the moving ``job``'s new group may adopt it now: its old group handed
        it off, or no runtime holds it any more (weaved restarted meanwhile)."""
        if job.job_id in self.ending or self._touches_busy(job):   # ended in its old
            return False                                           # group: not adopted
        if job.job_id in self.resume:
            return True
        old = self.groups.get(job.moving_from or 0)
        member = old.members.get(str(job.job_id)) if old is not None else None
        if member is not None and member.state is not MemberState.CANCELLED:
            return False
        self.resume[job.job_id] = self._carried(store, job)
        return True

    def _carried(self, store: Store, job: JobRow) -> Resume:
        """Its newest checkpoint under its old group's training node roots."""
        src = f"group {job.moving_from}"
        nodes = [n for _, n in pool_nodes(store.allocs(job.moving_from or 0), "train")]
        base = self.checkpoint_base
        version = None if base is None or not nodes else \
            checkpoint_version(base / nodes[0], JobRef(str(job.job_id), job.uid))
        if base is None or version is None:
            return Resume(ResumeKind.FRESH, f"moving from {src}; no checkpoint of it was "
                          "found there, so it starts afresh",
                          note=f"moved from {src} without a checkpoint; restarted from "
                               "scratch")
        return moved_with(src, base / nodes[0], version, tuple(base / n for n in nodes[1:]))

    def moved_in(self, store: Store, job: JobRow, group_id: int) -> None:
        """The new group adopted ``job``: its old group lets it go, the move is done."""
        src = job.moving_from
        old = self.groups.get(src or 0)
        key = str(job.job_id)
        if not self._let_go(store, job, f"moved from group {src} to group {group_id} by a "
                                        "re-plan") and old is not None:
            old.apply(Drop(key))   # weaved restarted mid-move: what it left on the old nodes
        log.info("job %s: moved from group %s to group %s", key, src, group_id)


def _drop_place(store: Store, group_id: int, job_id: int) -> None:
    """The old group's plan without the place a moved (or ended) job kept in it."""
    group = store.group(group_id)
    if group is not None and job_id in group.plan.job_ids:
        store.update("group", group_id, plan=group.plan.without({job_id}).to_json())


def _waits_for_plan(store: Store, job: JobRow) -> bool | None:
    """Whether ``job``'s move waits for its new group's next plan, in which alone it is
    listed (a chain: the moves it waits for decide, their withdrawal drops that plan).
    None: it is in neither plan any more (the move it waited for was withdrawn)."""
    group = store.group(job.group_id or 0)
    if group is None or job.job_id in group.plan.job_ids:
        return False
    return True if job.job_id in group.plan.next_ids else None


def _waits_for(store: Store, job: JobRow) -> str:
    """What a waiting move waits for, in words: its new group's nodes, or (its move
    waits for that group's new plan) the jobs still to move out of that group."""
    group = store.group(job.group_id or 0)
    if group is not None and job.job_id in group.plan.next_ids:
        out = ", ".join(map(str, group.plan.leaving_ids))
        return f"waiting for job(s) {out} to move out of group {group.group_id} first"
    return f"waiting for its nodes there{_why_not_held(store, job.group_id or 0)}"


def _why_not_held(store: Store, group_id: int) -> str:
    """``" (<reason>)"`` of the group's first allocation not held yet, else empty."""
    rows = [a for a in store.allocs(group_id) if a.state is not AllocState.HELD]
    return f" ({rows[0].reason})" if rows and rows[0].reason else ""


def _committed_s(store: Store, job_id: int, now: float) -> float:
    """When the move of ``job_id`` was committed: its last logged transition
    (``commit_moves`` logs one; a RUNNING job logs none until it ends), or ``now`` if the
    log has none."""
    rows = store.transitions("job", job_id)
    return min(rows[-1].ts, now) if rows else now
