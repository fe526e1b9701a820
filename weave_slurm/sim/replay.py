"""Trace replay: jobs arrive, are placed, progress in their groups, and depart.

Design (docs/simulator.md): the replay is a discrete-event simulation on
:class:`weave_slurm.sim.events.Simulator` (virtual clock, ties on (time, priority,
sequence)). Between two changes of a group's membership its cyclic schedule is periodic,
so every member progresses at ``1 / expected_period`` iterations per second: the replay
integrates progress, cost and pool usage analytically from change to change instead of
simulating each phase. Phase-level execution (stochastic rollouts, long-tail migration,
invariants, Gantt charts) is :mod:`weave_slurm.sim.execution`, run per group segment.

Every decision goes through :mod:`weave_slurm.placement` (``policy.place``, ``apply``,
``depart``, ``place_batch``); this module only keeps time and books.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from weave_slurm.model.cost import DEFAULT_MOVE_RESTART_S
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState, apply, depart
from weave_slurm.placement.consolidate import consolidation, regrouped
from weave_slurm.placement.decision import Admission, Placement, Refusal
from weave_slurm.placement.group import Group, Member, with_profile
from weave_slurm.placement.moves import pauses, relabel
from weave_slurm.placement.replan import Replan, replace_jobs, replan_worst, waiting_refusal
from weave_slurm.sim.bound import trace_bound
from weave_slurm.sim.drift import DriftModel
from weave_slurm.sim.events import Simulator
from weave_slurm.sim.failures import FailureModel, pick_failure
from weave_slurm.sim.ledger import Ledger
from weave_slurm.sim.live import placeable, placing, planning
from weave_slurm.sim.live_pools import LivePools, planned
from weave_slurm.sim.outcome import JobRun, ReplayResult, Segment
from weave_slurm.sim.policies import (
    Accounting,
    SimPolicy,
    StalenessMix,
    job_profile,
    job_work,
    optimum_rate,
    refuse_pooled,
    scale_profile,
)
from weave_slurm.sim.traces import EventKind, Trace, TraceJob

__all__ = ["JobRun", "Replay", "ReplayOptions", "ReplayResult", "Segment", "replay_policies"]

_EPS = 1e-9
# Event priorities at equal times: departures free capacity before arrivals ask for it.
_P_DEPART, _P_FAIL, _P_DRIFT, _P_ARRIVE, _P_REGROUP = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class ReplayOptions:
    accounting: Accounting = Accounting.REFERENCE
    max_group_size: int | None = None
    seed: int = 0
    regroup_interval_s: float = 3600.0
    rollout_mean_fraction: float = 1.0  # expected rollout phase / admission bound
    # Restart pause of a job whose warm state moves (model.cost.MoveCost): on top of
    # copying its state over the site's intra-pool links (~5-10 s for 250-500 GB at
    # 400 Gb/s), charged to the job (it makes no progress while paused).
    migration_s: float = DEFAULT_MOVE_RESTART_S
    recent_jobs: int = 6  # arrivals re-placed together with each new one (0: off)
    recent_local: bool = False  # ... only among their own groups (O(window) per arrival)
    replan_interval_s: float = 3600.0  # periodic charged re-plan (0: off)
    replan_groups: int = 8  # ... of the members of this many least efficient groups
    failures: FailureModel | None = None
    drift: DriftModel | None = None
    staleness: StalenessMix = field(default_factory=StalenessMix)
    optimum_max_jobs: int = 10  # larger concurrent sets fall back to the weave plan
    # weaved's [runtime] gangs: a member trains as one rank per GPU of its training
    # nodes (this many GPUs each; None: gangs off, one process a member); weave-live
    # co-locates no job of more than one rank (sim/live.py, daemon/colocating.py)
    gang_gpus: int | None = 8
    # weave-live with pools: whether trace jobs are taken as width-free (their batch
    # does not depend on their engine count), so weaved may pool them (sim/live_pools.py)
    width_free: bool = True
    record_segments: bool = True


class Replay:
    """One policy over one trace."""

    def __init__(self, trace: Trace, capacity: Capacity, policy: SimPolicy,
                 options: ReplayOptions | None = None) -> None:
        self.trace = trace
        self.policy = policy
        self.opt = options or ReplayOptions()
        if capacity.rollout_pooled:
            refuse_pooled([policy.name], self.opt.gang_gpus is not None)
            if not policy.pooling:
                capacity = replace(capacity, rollout_pooled=False)   # baselines: whole nodes
        self.pools = LivePools() if policy.weaved_moves and capacity.rollout_pooled else None
        if capacity.colocation and not policy.colocating:
            capacity = replace(capacity, colocation=False)   # the baselines' own rules
        self.cap = capacity = replace(capacity, moves=replace(
            capacity.moves, restart_s=self.opt.migration_s))
        self.sim = Simulator()
        self.state = ClusterState(capacity)
        self.recent: list[str] = []  # admitted jobs, most recent last
        self.runs: dict[str, JobRun] = {}
        self.pending: list[str] = []
        self.rng = random.Random(self.opt.seed)
        start_s = trace.events[0].time_s if trace.events else 0.0
        self.books = Ledger(start_s, self.opt.record_segments)
        self._opt_rate: float | None = None
        self._failure_handle: int | None = None
        self._opt_cache: dict[frozenset[str], float | None] = {}
        self.result = ReplayResult(
            policy.name, self.opt.accounting, capacity, start_s, start_s, {}, {},
            0.0, 0.0, {}, [], self.runs,
            {a.value: 0 for a in Admission}, [], [])

    # ---------------------------------------------------------------- driving

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        self._schedule_trace()
        if self.policy.regroup and self.trace.events:
            self.sim.schedule(self.books.last_s + self.opt.regroup_interval_s, self._on_regroup,
                              priority=_P_REGROUP)
        if self.policy.replan and self.opt.replan_interval_s > 0 and self.trace.events:
            self.sim.schedule(self.books.last_s + self.opt.replan_interval_s, self._on_replan,
                              priority=_P_REGROUP)
        end_s = self.trace.end_s
        while self.sim.peek() != math.inf:
            self.sim.step()
            if progress is not None:
                progress(self.sim.now)
        end_s = max(end_s, self.sim.now)
        self._advance(end_s)
        for r in self.runs.values():
            if r.departure_s is None:
                r.settle(end_s)
        self.books.close_segments(self.state, end_s, set(self.state.by_id),
                                  self.result.segments)
        res = self.result
        res.end_s = end_s
        self.books.fill(res)
        opt = self.opt
        res.bound = trace_bound(self.trace, self.cap.rates, opt.accounting,
                                opt.rollout_mean_fraction, opt.staleness.staleness_of)
        return res

    def _schedule_trace(self) -> None:
        events = self.trace.events
        by_id = {j.job_id: j for j in self.trace.jobs}
        i = 0
        while i < len(events):
            ev = events[i]
            if ev.kind is EventKind.ARRIVAL:
                batch = [ev.job_id]
                while (i + 1 < len(events) and events[i + 1].kind is EventKind.ARRIVAL
                       and events[i + 1].time_s == ev.time_s):
                    i += 1
                    batch.append(events[i].job_id)
                self.sim.schedule(ev.time_s, self._on_arrivals,
                                  [by_id[j] for j in batch], priority=_P_ARRIVE)
            elif self.opt.accounting is Accounting.REFERENCE:
                self.sim.schedule(ev.time_s, self._on_departure, ev.job_id, priority=_P_DEPART)
            i += 1
        if self.opt.accounting is Accounting.CONSISTENT:
            # Jobs that never finish their work inside the trace stop at its last event.
            self.sim.schedule(self.trace.end_s, self._on_trace_end, priority=_P_DEPART)

    # ---------------------------------------------------------------- events

    def _on_arrivals(self, jobs: list[TraceJob]) -> None:
        now = self.sim.now
        profiles = []
        for job in jobs:
            p = self._profile(job)
            self.runs[job.job_id] = JobRun(job, p, p, now, job_work(job, p, self.opt.accounting),
                                           since_s=now)
            self._schedule_drift(job, now)
            profiles.append(p)
        self._admit(profiles, count=True)
        if self.policy.replace_recent and self.opt.recent_jobs > 0:
            active = [j for j in self.recent if self.runs[j].group_id is not None]
            self.recent = active[-self.opt.recent_jobs:]
            self._take(replace_jobs(self.policy.placement, self._planning(), self.recent,
                                    self._remaining(), free=[j.job_id for j in jobs],
                                    local=self.opt.recent_local))

    def _profile(self, job: TraceJob) -> JobProfile:
        p = job_profile(job, self.policy.name, self.opt.accounting,
                        self.opt.rollout_mean_fraction,
                        self.opt.staleness.staleness_of(job.job_id))
        if self.pools is not None:   # weave-live: pooled only where weaved may pool it
            p = planned(p, self.opt.width_free)
        # weave-live: what weaved's runtime cannot run co-located is never placed so
        return placeable(p, self.opt.gang_gpus, self.cap) if self.policy.weaved_moves else p

    def _placing(self) -> ClusterState:
        """The state placement places jobs not running yet into (weave-live: weaved's
        co-located groups closed, sim/live.py)."""
        return placing(self.state) if self.policy.weaved_moves else self.state

    def _planning(self) -> ClusterState:
        """The state running jobs are re-planned in (weave-live: with co-location
        off, as weaved, sim/live.py)."""
        return planning(self.state) if self.policy.weaved_moves else self.state

    def _admit(self, profiles: list[JobProfile], count: bool) -> None:
        t0 = time.perf_counter()
        view = self._placing()
        if len(profiles) == 1:
            decisions: tuple[Placement | Refusal, ...] = (
                self.policy.placement.place(view, profiles[0]),)
            state = (apply(view, decisions[0]) if isinstance(decisions[0], Placement)
                     else self.state)
        else:
            batch = place_batch(self.policy.placement, view, profiles)
            state, decisions = batch.state, batch.decisions
        self.result.placement_s.append((time.perf_counter() - t0) / len(profiles))
        for p, d in zip(profiles, decisions, strict=True):
            if isinstance(d, Placement):
                if count:
                    self.result.admissions[d.admission.value] += 1
                self.runs[p.job_id].admission = d.admission.value
                self.recent.append(p.job_id)
            else:
                self.result.refusals += 1
                self.pending.append(p.job_id)
        # running members an admission re-pins (a small group re-pinned around the
        # newcomer, a pool that changes width) pay their pause as any re-pin does
        self._transition(state, pauses(self.state, state, [p.job_id for p in profiles]))

    def _on_departure(self, job_id: str) -> None:
        run = self.runs.get(job_id)
        if run is None or run.departure_s is not None:
            return
        now = self.sim.now
        run.settle(now)
        run.departure_s = now
        gid = run.group_id
        run.group_id = None
        run.violated = False
        if run.handle is not None:
            self.sim.cancel(run.handle)
        if job_id in self.pending:
            self.pending.remove(job_id)
            return
        if gid is None:
            return
        self._transition_charged(depart(self.state, job_id))  # compaction re-pins pay
        if self.policy.consolidate:
            self._take(consolidation(self.policy.placement, self._planning(), gid,
                                     self._remaining()))
        self._retry_pending()

    def _on_trace_end(self) -> None:
        for job_id, run in list(self.runs.items()):
            if run.departure_s is None and not math.isfinite(run.work):
                self._on_departure(job_id)

    def _retry_pending(self) -> None:
        if not self.pending:
            return
        waiting, self.pending = self.pending, []
        self._admit([self.runs[j].actual for j in waiting], count=True)

    def _on_replan(self) -> None:
        self._take(replan_worst(self.policy.placement, self._planning(),
                                self.opt.replan_groups, self._remaining()))
        if self.sim.now < self.trace.end_s:
            self.sim.schedule_in(self.opt.replan_interval_s, self._on_replan,
                                 priority=_P_REGROUP)

    def _remaining(self) -> dict[str, float] | None:
        """Seconds each running job still needs, where its work is known (consistent
        accounting); None where it is not (a scheduler does not know fixed lifetimes)."""
        if self.opt.accounting is not Accounting.CONSISTENT:
            return None
        return {j: self.runs[j].remaining_s(self.sim.now) for j in self.state.job_group}

    def _take(self, plan: Replan | None) -> None:
        if plan is None or (self.policy.weaved_moves
                            and waiting_refusal(self.state, plan.state) is not None):
            return   # none, or weaved would not take it: a move could not wait safely
        self.result.replans += 1
        self._transition(plan.state, plan.pauses)

    def _transition_charged(self, new: ClusterState) -> None:
        """A re-plan taken whatever it costs (the regroup baseline, an SLO-driven re-plan
        under drift): its moves are charged as any other's."""
        after = relabel(self.state, new)
        self._transition(after, pauses(self.state, after))

    def _on_regroup(self) -> None:
        active = [r for r in self.runs.values() if r.group_id is not None]
        for r in active:
            r.planned = r.actual
        self.result.regroups += 1
        self._transition_charged(regrouped(self.policy.placement, self.state,
                                           [r.actual for r in active]))
        if self.sim.now < self.trace.end_s:
            self.sim.schedule_in(self.opt.regroup_interval_s, self._on_regroup,
                                 priority=_P_REGROUP)

    def _schedule_drift(self, job: TraceJob, now: float) -> None:
        if self.opt.drift is None:
            return
        life = job.lifetime_s if job.lifetime_s is not None else self.trace.end_s - now
        for point in self.opt.drift.points(job.job_id):
            self.sim.schedule(now + point.at_fraction * life, self._on_drift, job.job_id,
                              point.rollout_factor, point.train_factor, priority=_P_DRIFT)

    def _on_drift(self, job_id: str, rollout_factor: float, train_factor: float) -> None:
        run = self.runs[job_id]
        if run.departure_s is not None or run.group_id is None:
            return
        run.settle(self.sim.now)  # the iterations so far ran at the old times
        base = self._profile(run.job)
        run.actual = scale_profile(base, rollout_factor, train_factor)
        gid = run.group_id
        group = self.state.by_id[gid]
        if self.policy.consolidate:
            # A re-planning policy plans with measured phase times, as the live daemon
            # does once a member has enough samples (runtime.profiler.planning_profile).
            run.planned = run.actual
            group = with_profile(group, run.actual)
            self._transition(replace(self.state, groups=tuple(
                group if g.group_id == gid else g for g in self.state.groups)))
        else:
            self._refresh_group(group)
        if self.policy.consolidate and self._actual_slowdowns_bad(group) and not (
                group.colocated and self.policy.weaved_moves):   # weaved: never switched
            # The live reconcile loop sees measured phase times miss the plan: re-plan
            # this group's members with what they now do.
            for m in group.members:
                self.runs[m.job.job_id].planned = self.runs[m.job.job_id].actual
            view = self._planning()
            rest = replace(view, groups=tuple(g for g in view.groups if g.group_id != gid))
            batch = place_batch(self.policy.placement, rest,
                                [self.runs[m.job.job_id].actual for m in group.members])
            if len(batch.state.job_group) == len(self.state.job_group):
                self._transition_charged(batch.state)

    def _actual_slowdowns_bad(self, group: Group) -> bool:
        return any(self.runs[j].violated for j in group.job_ids)

    def _schedule_failure(self) -> None:
        """Draw the next failure at the current node count; redrawn on every change
        (exponential gaps are memoryless, so this is exact for a piecewise-constant
        count)."""
        fm = self.opt.failures
        if fm is None:
            return
        if self._failure_handle is not None:
            self.sim.cancel(self._failure_handle)
            self._failure_handle = None
        nodes = self.state.rollout_nodes_used + self.state.train_nodes_used
        delay = fm.next_failure_in_s(self.rng, nodes)
        if self.sim.now + delay < self.trace.end_s:
            self._failure_handle = self.sim.schedule_in(delay, self._on_failure,
                                                        priority=_P_FAIL)

    def _on_failure(self) -> None:
        fm = self.opt.failures
        assert fm is not None  # only scheduled with a failure model
        self._failure_handle = None
        hit = pick_failure(self.state.groups, self.rng)
        if hit is not None and hit.jobs:
            now = self.sim.now
            self.result.failures += 1
            state = self.state
            profiles = []
            for job_id in hit.jobs:
                run = self.runs[job_id]
                run.settle(now)
                lost = fm.lost_iterations(run.done)
                run.done -= lost
                run.lost_iterations += lost
                run.failures += 1
                run.paused_until_s = now + fm.restart_s
                state = depart(state, job_id)
                run.group_id, run.rate = None, 0.0
                profiles.append(run.actual)
            self._transition(state)
            self._admit(profiles, count=False)
        else:
            self._schedule_failure()

    # ---------------------------------------------------------------- books

    def _advance(self, now: float) -> None:
        override = self._opt_rate if self.policy.optimal else None
        self.books.advance(self.state, now, self.cap.rates, override)

    def _transition(self, new: ClusterState, charged: Mapping[str, float] | None = None
                    ) -> None:
        now = self.sim.now
        self._advance(now)
        if self.policy.weaved_moves and (new.closed or new.capacity != self.cap):
            # a plan made in a view (sim/live.py) runs on the replay's own capacity
            new = replace(new, capacity=self.cap, closed=frozenset())
        old = self.state
        if self.pools is not None:   # weave-live: each pool on the GPUs weaved holds
            new = self.pools.hold(old, new, self._remaining())
            longer = self.pools.overlap_gpu_s / self.cap.rollout_gpus_per_node
            self.books.held_longer(longer, self.cap.rates)
            self.result.held_longer_node_s += longer
            if charged is not None:
                charged = self.pools.recharged(old, new, charged)
        changed = {gid for gid, g in old.by_id.items() if new.by_id.get(gid) is not g}
        changed |= {gid for gid in new.by_id if gid not in old.by_id}
        self.books.close_segments(old, now, changed & set(old.by_id), self.result.segments)
        self.state = new
        for gid in changed:
            group = new.by_id.get(gid)
            self.books.swap(old.by_id.get(gid), group, now)
            if group is None:
                continue
            for job_id in group.job_ids:
                pause = (charged or {}).get(job_id)
                if pause is None:
                    continue
                run = self.runs[job_id]
                run.settle(now)  # progress up to the move counts; the pause follows
                if run.group_id != gid:
                    run.migrations += 1
                    self.result.migrations += 1
                else:
                    self.result.repins += 1
                run.paused_s += pause
                run.paused_until_s = max(run.paused_until_s, now) + pause
                self.books.pause(group, job_id, pause)
            self._refresh_group(group)
        if self.policy.optimal:
            self._update_optimum()
        rate = self._opt_rate if self.policy.optimal and self._opt_rate is not None \
            else new.cost_per_hour
        self.books.record(new, now, rate)
        if self.opt.failures is not None:
            self._schedule_failure()

    def _update_optimum(self) -> None:
        jobs = [self.runs[j].planned for j in self.state.job_group]
        key = frozenset(self.state.job_group)
        if key not in self._opt_cache:
            rate = (optimum_rate(jobs, self.cap) if len(jobs) <= self.opt.optimum_max_jobs
                    else None)
            self._opt_cache[key] = rate
        self._opt_rate = self._opt_cache[key]
        if self._opt_rate is None:
            self.result.optimum_fallbacks += 1

    def _refresh_group(self, group: Group) -> None:
        """Settle the members' progress and set their new rates from the schedule."""
        now = self.sim.now
        if all(self.runs[j].actual is m.job for j, m in zip(group.job_ids, group.members,
                                                             strict=True)):
            sched = group.schedule
        else:
            sched = replace(group, members=tuple(Member(self.runs[m.job.job_id].actual,
                                                        m.rollout_pins, m.turns)
                                                 for m in group.members)).schedule
        period = sched.expected_period_s
        for m in group.members:
            k = m.turns
            run = self.runs[m.job.job_id]
            run.settle(now)
            run.group_id = group.group_id
            run.rate = k / period if period > 0 else 0.0
            run.slowdown = period / (k * run.actual.solo_mean_s)
            run.max_slowdown = max(run.max_slowdown, run.slowdown)
            run.violated = run.slowdown > run.actual.slo + _EPS
            run.ever_violated = run.ever_violated or run.violated
            if self.opt.accounting is Accounting.CONSISTENT:
                self._reschedule_departure(run)

    def _reschedule_departure(self, run: JobRun) -> None:
        if run.handle is not None:
            self.sim.cancel(run.handle)
            run.handle = None
        if run.rate <= 0 or not math.isfinite(run.work):
            return
        now = self.sim.now
        eta = max(now, run.paused_until_s) + max(0.0, run.work - run.done) / run.rate
        run.handle = self.sim.schedule(eta, self._on_departure, run.job.job_id,
                                       priority=_P_DEPART)


def replay_policies(trace: Trace, capacity: Capacity, policies: tuple[str, ...],
                    options: ReplayOptions | None = None,
                    progress: Callable[[str, float], None] | None = None
                    ) -> dict[str, ReplayResult]:
    """Replay ``trace`` once per policy (each from an empty cluster)."""
    out: dict[str, ReplayResult] = {}
    opts = options or ReplayOptions()
    for name in policies:
        replay = Replay(trace, capacity, SimPolicy.make(name, opts.seed), opts)
        cb = None if progress is None else (lambda t, n=name: progress(n, t))
        out[name] = replay.run(cb)
    return out
