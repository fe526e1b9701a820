"""A running job moved between two groups' runtimes by a re-plan (docs/daemon.md,
"Re-planning running jobs").

The reconcile loop commits a re-plan's moves to the store (:meth:`Store.commit_moves`):
a moved job's row names its new group and the group it is ``moving_from``. The group
runtime then carries the move out, one step boundary at a time:

1. once the new group's runner holds the job's pinned nodes, the old runner hands the
   member off (``Lifecycle.hand_off``): it trains what it has rolled out, starts no
   rollout, and at that boundary its step is checkpointed under its training node's
   root on the shared file system and it is MOVED there (``Lifecycle.hand_offs``);
2. the new runner adopts it with that checkpoint (``ResumeKind.CARRIED``: its new
   training node copies it in), re-admits it from it and runs it on;
3. the old runner lets it go (its warm state and checkpoints there dropped) and the
   row's ``moving_from`` is cleared; its reason says where it came from.

After a weaved restart between 1 and 3 no runner holds the member any more: the new
group adopts it from the newest checkpoint under its old training node's root, which
the old group keeps while a move out of it is unfinished (the reconcile loop drains
no such group).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from weave_slurm.daemon.driver import pool_nodes
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import WeaveError
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member import Member
from weave_slurm.runtime.resume import Resume, ResumeKind, checkpoint_version, moved_with
from weave_slurm.runtime.runner import GroupRunner

log = logging.getLogger(__name__)

_OUT = (MemberState.MOVED, MemberState.CANCELLED)


class Handoffs:
    """The group runtime's moves in flight (its runners and resumes, shared)."""

    def __init__(self, groups: Mapping[int, GroupRunner], resume: dict[int, Resume],
                 waiting: dict[int, str], checkpoint_base: Path | None) -> None:
        self.groups, self.resume, self.waiting = groups, resume, waiting
        self.checkpoint_base = checkpoint_base
        self.ending: set[int] = set()   # ended before their hand-off (reported once)

    def hand_off(self, store: Store, placed: Callable[[JobRow], bool]) -> None:
        """Start each move whose new group can take the job now (``placed``: its pinned
        nodes are in the new group's runner), and hand off the members at their step
        boundary."""
        for job in store.jobs([JobState.RUNNING]):
            if job.moving_from is None or job.moving_from == job.group_id:
                continue
            old = self.groups.get(job.moving_from)
            member = old.members.get(str(job.job_id)) if old is not None else None
            if member is None or member.state in _OUT or member.handoff:
                continue
            if job.group_id not in self.groups or not placed(job):
                self.waiting[job.job_id] = (f"moving from group {job.moving_from} to group "
                                            f"{job.group_id}: waiting for its nodes there")
                continue
            assert old is not None
            old.lifecycle.hand_off(str(job.job_id))
            self.waiting[job.job_id] = (f"moving from group {job.moving_from} to group "
                                        f"{job.group_id}: finishing its step in flight")
        for gid, runner in self.groups.items():
            for key, resume in runner.lifecycle.hand_offs(self.checkpoint_base,
                                                          f"group {gid}").items():
                self.resume[int(key)] = resume
                log.info("job %s: handed off by group %s (%s)", key, gid, resume.kind.value)

    def ended(self) -> list[tuple[int, GroupRunner, Member]]:
        """Members that reached their last step (or gave up) while their hand-off was
        pending: their old group reports them (job id, its runner, the member)."""
        out = [(int(key), runner, m) for runner in self.groups.values()
               for key, m in runner.members.items()
               if m.handoff and m.state in (MemberState.DONE, MemberState.FAILED)]
        self.ending.update(job_id for job_id, _, _ in out)
        return out

    def ready(self, store: Store, job: JobRow) -> bool:
        """Whether the moving ``job``'s new group may adopt it now: its old group handed
        it off, or no runner holds it any more (weaved restarted meanwhile)."""
        if job.job_id in self.ending:   # it ended in its old group: not adopted
            return False
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
        if old is not None and key in old.members \
                and old.members[key].state is not MemberState.CANCELLED:
            try:
                old.leave(key)
            except WeaveError as exc:
                log.warning("job %s: leaving group %s after its move: %s", key, src, exc)
        elif old is not None:   # weaved restarted mid-move: what it left on the old nodes
            for node in (*old.layout.train, *old.layout.rollout):
                old.link.best_effort(node, Op.DROP, job=key)
        self.waiting.pop(job.job_id, None)
        store.update("job", job.job_id, moving_from=None,
                     reason=f"moved from group {src} to group {group_id} by a re-plan")
        log.info("job %s: moved from group %s to group %s", key, src, group_id)
