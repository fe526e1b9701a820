"""Re-planning running jobs inside weaved, charged as the simulator charges it
(docs/daemon.md, "Re-planning running jobs"; the decisions: placement/replan.py).

Three triggers, as in ``weave simulate``'s ``weave`` policy:

- **consolidation**: a job left a group; the members left behind are placed again into
  the rest of the cluster (``placement.consolidate.consolidation``);
- **the periodic re-plan**: every ``[runtime] replan_interval_s``, the members of the
  ``replan_groups`` least efficient groups placed again together
  (``placement.replan.replace_jobs`` over ``worst_groups``);
- **arrivals**: the running jobs placed last placed again with the jobs a placement
  batch places (``[runtime] recent_jobs``; :meth:`Replanner.with_arrivals`, which the
  placer calls and whose moves it writes with the placement).

A proposal is taken only when it pays once its moves are charged (each moved job's
warm state over the site's links plus a restart, over the time it has left: its
remaining iterations at its planned rate; SLOs kept with the pause absorbed). Only
RUNNING jobs that weaved's runtime hosts (their phases run in its workers) in ACTIVE
groups are moved, never while an earlier move is unfinished, and only where moves are
possible: weaved's group runtime with node checkpoints on a file system it shares with
the nodes. A move into a group that is new, grows or is not active yet waits for its
nodes while the job runs on in its old group, where it keeps its place and which takes
its new plan once the job is out (a move into that group waits for that plan); it is
taken only where that group's new plan needs no node it does not hold and no group
waits for itself (``placement.replan.waiting_moves``), and
withdrawn if the nodes are not held within ``move_wait_s`` (docs/daemon.md, "Moves that wait
for nodes"). The accepted plan is committed at once (:meth:`Store.commit_moves`); the group
runtime carries each move out at the job's step boundary (:mod:`~weave_slurm.daemon.handoff`),
and a group left without members drains once nothing moves out of it any more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from weave_slurm.config.runtime import RuntimeConfig
from weave_slurm.daemon import membership
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow, by_group
from weave_slurm.daemon.states import GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import StateError
from weave_slurm.placement import Capacity, ClusterState, WeavePolicy
from weave_slurm.placement.consolidate import consolidation
from weave_slurm.placement.replan import (
    Replan,
    deferring,
    moved_jobs,
    needs_nodes,
    replace_jobs,
    waiting_moves,
    waiting_refusal,
    worst_groups,
)

log = logging.getLogger(__name__)

_LIVE_JOB = (JobState.PLACED, JobState.RUNNING, JobState.CANCELLING)


class Replanner:
    """Proposes, charges and commits re-plans; the group runtime moves the jobs."""

    def __init__(self, store: Store, capacity: Capacity, policy: WeavePolicy,
                 instance: str, config: RuntimeConfig,
                 live: Callable[[int], dict[str, Any] | None], start_s: float) -> None:
        self.store, self.capacity, self.policy = store, capacity, policy
        self.instance, self.config, self.live = instance, config, live
        self.last_s = start_s
        self.departed: set[int] = set()   # groups a job left since the last look

    def left(self, group_id: int) -> None:
        """A job left group ``group_id`` (consolidation looks at it next tick)."""
        if self.config.consolidate:
            self.departed.add(group_id)

    def tick(self, now: float) -> None:
        self.settle(now)
        departed, self.departed = self.departed, set()
        every_s = self.config.replan_interval_s
        periodic = every_s > 0 and now - self.last_s >= every_s
        if not departed and not periodic:
            return
        if any(j.moving_from is not None for j in self.store.jobs([JobState.RUNNING])):
            self.departed |= departed   # one re-plan at a time: the next tick looks again
            return
        groups, allocs, before, movable = self._view()
        remaining = self.remaining(before)
        for gid in sorted(departed):
            shrunk = before.by_id.get(gid)
            if shrunk is not None and set(shrunk.job_ids) <= movable and self._take(
                    consolidation(self.policy, before, gid, remaining), before, groups,
                    allocs, movable, now, "consolidation after a departure"):
                return
        if periodic:
            self.last_s = now
            picked = [g for g in worst_groups(before, len(before.groups))
                      if set(g.job_ids) <= movable][:self.config.replan_groups]
            ids = [j for g in picked for j in g.job_ids]
            if len(ids) >= 2:
                self._take(replace_jobs(self.policy, before, ids, remaining), before, groups,
                           allocs, movable, now,
                           f"re-plan of the {len(picked)} least efficient groups")

    def settle(self, now: float) -> None:
        """Drain each active group a re-plan emptied once no job moves out of it."""
        moving = {j.moving_from for j in self.store.jobs([JobState.RUNNING])}
        for group in self.store.groups():
            if group.state is GroupState.ACTIVE and not group.plan.members \
                    and group.group_id not in moving \
                    and not self.store.jobs(_LIVE_JOB, group_id=group.group_id):
                self.store.transition("group", group.group_id, GroupState.DRAINING,
                                      "a re-plan moved its members to other groups", now)

    def _view(self) -> tuple[list[GroupRow], dict[int, list[AllocRow]], ClusterState, set[str]]:
        groups = self.store.groups()
        allocs = by_group(self.store.allocs(live_only=False))
        jobs = self.store.jobs(_LIVE_JOB)
        state = membership.cluster_state(self.capacity, groups, jobs,
                                         self.store.next_group_id(), allocs)
        active = {g.group_id for g in groups if g.state is GroupState.ACTIVE}
        movable = {str(j.job_id) for j in jobs if j.state is JobState.RUNNING
                   and j.group_id in active and _hosted(j)}
        return groups, allocs, state, movable

    def remaining(self, state: ClusterState) -> dict[str, float]:
        """Seconds each running job still needs: its iterations left at its planned
        rate (its version as the runtime shows it)."""
        out = {}
        for g in state.groups:
            for m in g.members:
                row = self.store.job(int(m.job.job_id))
                spec = row.spec if row is not None else None
                if spec is None:
                    continue   # not known: placement assumes its default horizon
                live = self.live(int(m.job.job_id)) or {}
                left = spec.iterations - int(live.get("version") or 0)
                out[m.job.job_id] = max(left, 0) * g.schedule.expected_period_s / m.turns
        return out

    def with_arrivals(self, before: ClusterState, placed: ClusterState,
                      arrivals: Sequence[int], groups: Sequence[GroupRow],
                      allocs: Mapping[int, Sequence[AllocRow]]) -> Accepted | None:
        """The running jobs placed last (with the arrivals, ``recent_jobs``), placed
        again together with the ``arrivals`` a batch just placed (``placed``: the cluster
        with them, ``before``: without), the arrivals moved at no charge (not started);
        what to write with the placement (None: nothing pays, or nothing to re-place).
        As the simulator's ``weave`` re-places recent arrivals: online placement nearer
        a batch's."""
        n = self.config.recent_jobs
        running = self.store.jobs([JobState.RUNNING])
        if n <= 0 or not arrivals or any(j.moving_from is not None for j in running):
            return None   # one re-plan at a time
        active = {g.group_id for g in groups if g.state is GroupState.ACTIVE
                  and not g.plan.colocated}   # a co-located member keeps its way
        keep = n - len(arrivals)   # the arrivals count among the ``n`` most recent
        if keep <= 0:
            return None
        recent = sorted((j for j in running if j.group_id in active and _hosted(j)),
                        key=lambda j: (j.started_s or 0.0, j.job_id))[-keep:]
        if not recent:
            return None
        view = replace(placed, capacity=self.capacity)   # co-location off, as re-plans
        ids = [str(j.job_id) for j in recent]
        new = [str(j) for j in arrivals]
        what = f"re-placement of job(s) {', '.join(ids)} with the arrival(s) {', '.join(new)}"
        return self._accept(replace_jobs(self.policy, view, [*ids, *new],
                                         self.remaining(view), free=new),
                            view, groups, allocs, set(ids), what, frozenset(new), before)

    def _take(self, plan: Replan | None, before: ClusterState, groups: Sequence[GroupRow],
              allocs: Mapping[int, Sequence[AllocRow]], movable: set[str], now: float,
              what: str) -> bool:
        """Commit an accepted proposal (None: nothing pays); True if committed."""
        accepted = self._accept(plan, before, groups, allocs, movable, what)
        if accepted is None:
            return False
        try:
            self.store.commit_moves(accepted.writes, accepted.moves, now)
        except StateError as exc:   # a job ended meanwhile: the next trigger looks again
            log.info("re-plan dropped: %s", exc)
            return False
        log.info("%s: %d job(s) moved (%s), %d group plan(s) written; %.1f%% less per "
                 "unit of work", what, len(accepted.moves),
                 ", ".join(str(m[0]) for m in accepted.moves), len(accepted.writes),
                 accepted.gain)
        return True

    def _accept(self, plan: Replan | None, before: ClusterState, groups: Sequence[GroupRow],
                allocs: Mapping[int, Sequence[AllocRow]], movable: set[str], what: str,
                free: frozenset[str] = frozenset(),
                stored: ClusterState | None = None) -> Accepted | None:
        """A proposal as weaved writes it, if it can carry out every move (None: no
        proposal, or one it cannot). ``free``: jobs placed in this very decision, not
        started: they go where the proposal puts them, no move; ``stored``: the cluster as
        the store holds it, where ``before`` has them placed already."""
        if plan is None:
            log.info("%s: no proposal pays once its moves are charged", what)
            return None
        after = plan.state
        moved = moved_jobs(before, after)   # job -> (from, to)
        if not set(moved) <= movable | free:   # relabelling moved another job instead
            log.info("%s: not taken, it moves job(s) %s, which weaved cannot move now", what,
                     ", ".join(sorted(set(moved) - movable - free)))
            return None
        # a move into a group that is new, grows or is not active yet waits for its nodes
        # while the job runs on in its old group, which keeps its plan until it is out
        active = {g.group_id for g in groups if g.state is GroupState.ACTIVE}
        forming = {to for j, (_, to) in moved.items() if j not in free} - active
        why = waiting_refusal(before, after, forming)
        waiting = (waiting_moves(before, after, forming) or frozenset()) - free
        if why is None and waiting and self.config.move_wait_s <= 0:
            why = "[runtime] move_wait_s = 0"
        if why is not None:
            grows = sorted(set(needs_nodes(before, after)) | forming)
            log.info("%s: not taken, it needs nodes weaved does not hold yet (group(s) %s) "
                     "and %s", what, ", ".join(map(str, grows)), why)
            return None
        base = before if stored is None else stored
        writes = membership.plan_writes(base, after, groups, allocs, self.instance,
                                        self.remaining(base))
        rows = {g.group_id: g for g in groups}
        for gid in sorted(set(base.by_id) - set(after.by_id)):   # emptied: drains later
            row = rows[gid]
            writes.append((gid, row.label, GroupPlan(row.plan.rollout_nodes,
                                                     row.plan.train_nodes, ()), False))
        held = deferring(before, after, waiting)
        writes = [_deferred(w, rows, moved, held, waiting) for w in writes]
        b = plan.books
        gain = 100 * (1 - b.efficiency_after / b.efficiency_before)
        moves = [(int(job_id), src, gid,
                  f"moving from group {src} to group {gid}: {what} costs {gain:.1f}% less "
                  f"per unit of work, its move charged {plan.pauses.get(job_id, 0.0):.0f} s")
                 for job_id, (src, gid) in sorted(moved.items()) if job_id not in free]
        return Accepted(after, writes, moves, gain)


@dataclass(frozen=True)
class Accepted:
    """A proposal weaved can carry out: the cluster after it, the group plans to write
    (as :meth:`Store.commit_placement` takes them) and each running job's move (job,
    from group, to group, reason); ``gain``: percent less per unit of work."""

    state: ClusterState
    writes: list[tuple[int, str, GroupPlan, bool]]
    moves: list[tuple[int, int, int, str]]
    gain: float


def _deferred(write: tuple[int, str, GroupPlan, bool], rows: Mapping[int, GroupRow],
              moved: Mapping[str, tuple[int, int]], held: Collection[int],
              waiting: frozenset[str]) -> tuple[int, str, GroupPlan, bool]:
    """A group's written plan where waiting movers leave it: its plan as it runs, without
    the jobs that leave it at once (so each waiting mover keeps its place), taking the
    new plan, with the jobs whose move into it waits for that, once the waiting movers
    are out (``GroupPlan.then``; docs/daemon.md, "Moves that wait for nodes")."""
    gid, label, plan, is_new = write
    if gid not in held:
        return write
    now_out = {int(j) for j, (src, _) in moved.items() if src == gid and j not in waiting}
    return gid, label, replace(rows[gid].plan.without(now_out), then=plan), is_new


def _hosted(job: JobRow) -> bool:
    """Whether weaved's runtime runs the job's phases (a cooperative job's own
    processes hold its nodes: it cannot be handed off at a step boundary)."""
    return job.spec is not None and job.spec.launch is None   # None: not read, not moved
