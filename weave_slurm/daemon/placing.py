"""Placing pending jobs, one act of the reconcile loop (:class:`Placer`).

Every tick, the jobs still PENDING are placed as one batch by the pure placement
engine (``placement/admission.py``), in the order fair share gives them and without
those a limit holds (:mod:`~weave_slurm.daemon.limits`); the new and changed group plans
and the jobs' move to PLACED are written in one transaction, or, when a job changed
meanwhile (cancelled while the batch was being decided), not at all and decided again.
A job that can never be placed is REFUSED; one that waits for room says why in REASON.
With the site's ``[limits] colocation``, placement may co-locate a job, except one
weaved's runtime cannot run so (:mod:`~weave_slurm.daemon.colocating`).

The running jobs placed last (``[runtime] recent_jobs``) are placed again together with
the batch's arrivals, the arrivals at no charge (not started), and where that pays once
the running jobs' moves are charged, the arrivals are placed where it puts them and the
moves are written in the same transaction (``Replanner.with_arrivals``,
daemon/replanning.py; the group runtime carries the moves out at step boundaries).

Where weaved pools rollout and a batch leaves jobs waiting for room, pools are narrowed
to admit them, one more at a time, and the batch is placed again; where that places
more, the narrower plans are written with the placement (daemon/room.py). A narrowing
that placed nothing more is tried again only once the batch, the groups or the pools
that may be narrowed changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon import colocating, limits, membership, pooling, room
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.fault_points import FaultPoint, crossing
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow, by_group
from weave_slurm.daemon.replanning import Accepted
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import StalePlacement, StateError
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement import (
    BatchResult,
    Capacity,
    ClusterState,
    Placement,
    Policy,
    Refusal,
    place_batch,
)

log = logging.getLogger(__name__)

#: (cluster as stored, cluster with the arrivals placed, their job ids, group rows,
#: allocation rows by group) -> what to write instead of the plain placement, or None
WithArrivals = Callable[[ClusterState, ClusterState, Sequence[int], Sequence[GroupRow],
                         Mapping[int, Sequence[AllocRow]]], Accepted | None]

_LIVE_JOB = (JobState.PLACED, JobState.RUNNING, JobState.CANCELLING)
#: How often one tick decides a placement again when jobs changed while it decided.
_PLACE_TRIES = 3


class Placer:
    """Places the pending jobs of a store (module doc)."""

    def __init__(self, store: Store, capacity: Capacity, policy: Policy, site: SiteConfig,
                 instance: str, on_placement: Callable[[float], object],
                 accounting: AccountingFeed | None = None) -> None:
        self.store, self.capacity, self.policy = store, capacity, policy
        self.accounting = accounting   # Slurm's limits ([limits] from_slurm)
        self.site, self.instance = site, instance
        self.on_placement = on_placement   # told each decision's seconds (metrics)
        #: the running jobs placed last re-placed with the arrivals: what to write with
        #: them (daemon/replanning.py, ``Replanner.with_arrivals``; None: never)
        self.with_arrivals: WithArrivals | None = None
        #: the batch and groups of the last narrowing that placed nothing more: tried
        #: again only once one of them changed (each try places the batch again)
        self._no_room: object = None

    def place(self, now: float) -> None:
        """Place the pending jobs as one batch. A job cancelled while the batch was being
        decided makes the decision stale (nothing of it is written): decide again on what
        is pending now, in this tick, rather than drop the tick's placement."""
        if self.accounting is not None:   # every tick: submissions are checked against it
            self.accounting.refresh(now)
        for _ in range(_PLACE_TRIES):
            try:
                self._place_batch(now)
                return
            except StalePlacement as exc:
                log.info("placement: %s; placing the pending jobs again", exc)
        log.warning("placement: jobs kept changing while being placed (%d tries); next "
                    "tick again", _PLACE_TRIES)

    def _place_batch(self, now: float, with_arrivals: bool = True) -> None:
        waiting = self.store.jobs([JobState.PENDING])
        if not waiting:
            return
        queue = limits.queue(self.store, self.site, waiting, now,   # fair share, limits
                             self.accounting)
        for job in waiting:
            held = queue.held.get(job.job_id)
            if held is not None and held != job.reason:
                self.store.update("job", job.job_id, reason=held)
        pending = queue.ordered
        if not pending:
            return
        groups = self.store.groups()
        allocs = by_group(self.store.allocs(live_only=False))
        live = self.store.jobs(_LIVE_JOB)
        before = membership.cluster_state(self.capacity, groups, live,
                                          self.store.next_group_id(), allocs)
        started = time.perf_counter()   # how long the decision took: not an input to it
        colo = self.capacity.colocation
        pooled = self.capacity.rollout_pooled   # a job pools only where it may
        profiles = [pooling.planned(colocating.placeable(j, self.site, self.capacity), j,
                                    pooled) for j in pending]
        result = place_batch(self.policy, before, profiles)
        if queue.priority and limits.overtaken(result.decisions):   # fair share first
            result = place_batch(self.policy, before, profiles, ordered=False)
        roomier = self._make_room(before, result, profiles, groups, live, allocs) \
            if pooled else None
        result = roomier or result
        self.on_placement(time.perf_counter() - started)
        arrivals = [j.job_id for j, d in zip(pending, result.decisions, strict=True)
                    if isinstance(d, Placement)]
        joint = None if self.with_arrivals is None or not arrivals or not with_arrivals \
            or roomier is not None else \
            self.with_arrivals(before, result.state, arrivals, groups, allocs)
        writes = membership.plan_writes(before, result.state, groups, allocs, self.instance) \
            if joint is None else joint.writes
        placed = []
        for job, decision in zip(pending, result.decisions, strict=True):
            if isinstance(decision, Placement):
                gid = decision.group_id if joint is None else \
                    joint.state.job_group[str(job.job_id)]
                placed.append((job.job_id, gid, f"{decision.admission.value} into group {gid}"
                               + ("" if joint is None else ", re-placed with recent arrivals")
                               + ("" if roomier is None else ", a pool narrowed to make room")))
                why = colocating.barrier(job, self.site) if colo else None
                if why is not None:
                    log.info("job %s: placed disaggregated, never co-located: %s",
                             job.job_id, why)
            elif isinstance(decision, Refusal) and not decision.retry:
                try:
                    self.store.transition("job", job.job_id, JobState.REFUSED,
                                          decision.message(), now, expect=JobState.PENDING,
                                          ended_s=now)
                except StateError:   # cancelled meanwhile: nothing to refuse
                    continue
            elif decision.message() != job.reason:
                self.store.update("job", job.job_id, reason=decision.message())
        if not placed:
            return
        if joint is not None:
            try:
                self.store.commit_placement(writes, placed, now, joint.moves)
            except StalePlacement:
                raise   # an arrival changed meanwhile: :meth:`place` decides again
            except StateError as exc:   # a moved job ended meanwhile: place them alone
                log.info("placement: re-placement with recent arrivals dropped: %s", exc)
                self._place_batch(now, with_arrivals=False)
                return
            log.info("placed jobs %s, re-placing job(s) %s with them (%.1f%% less per unit "
                     "of work)", [p[0] for p in placed], [m[0] for m in joint.moves],
                     joint.gain)
        else:
            self.store.commit_placement(writes, placed, now)
            log.info("placed jobs %s%s", [p[0] for p in placed], "" if roomier is None else
                     ", narrowing the pool(s) of group(s) " + ", ".join(
                         str(g.group_id) for g in roomier.state.groups
                         if (b := before.by_id.get(g.group_id)) is not None
                         and b.pool_gpus > g.pool_gpus and b.members == g.members))
        crossing(FaultPoint.PLACE_COMMITTED)

    def _make_room(self, before: ClusterState, result: BatchResult,
                   profiles: Sequence[JobProfile], groups: Sequence[GroupRow],
                   live: Sequence[JobRow], allocs: Mapping[int, Sequence[AllocRow]]
                   ) -> BatchResult | None:
        """The batch placed again with pools narrowed to admit jobs that wait for room
        (daemon/room.py), where that places more of it; None otherwise."""
        if not any(isinstance(d, Refusal) and d.retry for d in result.decisions):
            return None
        narrower = room.candidates(before, groups, live, allocs)
        key = (tuple(p.job_id for p in profiles),
               tuple((g.group_id, g.pool_gpus) for g in narrower),
               tuple((g.group_id, g.pool_gpus, g.job_ids) for g in before.groups))
        if not narrower or key == self._no_room:
            return None
        placed = _placed(result)
        for state in room.narrowings(before, narrower):
            again = place_batch(self.policy, state, profiles)
            if _placed(again) > placed:
                return again
        self._no_room = key
        return None


def _placed(result: BatchResult) -> int:
    return sum(isinstance(d, Placement) for d in result.decisions)
