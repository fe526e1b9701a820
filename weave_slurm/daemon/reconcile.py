"""The reconcile loop: read the world, then act. One bad tick is logged and survived.

A tick (:meth:`Reconciler.tick`) first reads what the backend holds (the allocations
this daemon owns, by uid and the instance tag in their comment, and their steps),
reconciles the store's rows with it (intents left by a crash are resolved against
what Slurm shows; owned allocations no row claims are released), then acts: stop
cancelled jobs, place pending jobs as one batch, obtain the allocations groups need and
return those a shrunk group no longer needs (:mod:`~weave_slurm.daemon.allocations`),
launch node daemons (a failing one backs off: :mod:`~weave_slurm.daemon.retries`),
activate groups, launch the jobs' steps and release the allocations of empty groups.
Every action writes its intent (a transition) before calling the backend.
Time comes from the injected clock; decisions never read the wall clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from weave_slurm.clock import Clock
from weave_slurm.config.runtime import RuntimeConfig
from weave_slurm.config.site import SiteConfig, default_site
from weave_slurm.daemon import colocating, membership
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.allocations import GroupAllocations, PoolRequest
from weave_slurm.daemon.driver import Driver
from weave_slurm.daemon.fault_points import FaultPoint, crossing
from weave_slurm.daemon.job_output import JobOutputs, Opener
from weave_slurm.daemon.job_terms import JobTerms
from weave_slurm.daemon.placing import Placer
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow, StepRow, by_group
from weave_slurm.daemon.replanning import Replanner
from weave_slurm.daemon.retries import NodeDaemonRetries, in_words
from weave_slurm.daemon.states import AllocState, GroupState, JobState, StepRunState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.usage_meter import UsageMeter
from weave_slurm.errors import WeaveError
from weave_slurm.model.cost import CostRates
from weave_slurm.node.open_as import open_as
from weave_slurm.placement import Capacity, WeavePolicy
from weave_slurm.slurm.backend import (
    Allocation,
    AllocationState,
    Backend,
    StepHandle,
    StepSpec,
    StepState,
)

__all__ = ["NODE_STEP", "NodeStepFactory", "PoolRequest", "Reconciler", "World"]

log = logging.getLogger(__name__)

NODE_STEP = "weave-node"
_LIVE_JOB = (JobState.PLACED, JobState.RUNNING, JobState.CANCELLING)


@dataclass
class World:
    """What the backend shows at the start of a tick."""

    allocations: dict[str, Allocation] = field(default_factory=dict)
    steps: dict[str, set[str]] = field(default_factory=dict)  # alloc id -> step names


NodeStepFactory = Callable[[GroupRow, AllocRow], StepSpec]


def _still_held(world: World, alloc_id: str | None) -> bool:
    """Whether Slurm still runs (or has not yet started) allocation ``alloc_id``: listed,
    and not being ended."""
    a = world.allocations.get(alloc_id or "")
    return a is not None and a.state is not AllocationState.ENDING


class Reconciler:
    """The daemon's control loop body; :meth:`tick` is called by the service."""

    def __init__(self, store: Store, backend: Backend, capacity: Capacity,
                 pools: dict[str, PoolRequest], driver: Driver, clock: Clock, *,
                 instance: str = "", node_step: NodeStepFactory | None = None,
                 immediate_s: int = 10, site: SiteConfig | None = None,
                 on_placement: Callable[[float], None] | None = None,
                 open_output: Opener = open_as, replan: RuntimeConfig | None = None,
                 accounting: AccountingFeed | None = None) -> None:
        self.store, self.backend, self.capacity = store, backend, capacity
        self.pools, self.driver, self.clock = pools, driver, clock
        self.instance = instance
        self.tag = membership.instance_tag(instance)   # with the uid: what is ours
        self.prefix = membership.name_prefix(instance)   # for people only
        self.node_step = node_step
        self.immediate_s = immediate_s
        self.policy = WeavePolicy()
        self.on_placement = on_placement   # told each decision's seconds (metrics)
        self._handles: dict[int, StepHandle] = {}  # step row key -> handle (this process)
        self.node_retries = NodeDaemonRetries()   # per alloc key: failing node daemons
        self.site = site = site or default_site()   # charges, prices, fair share, limits
        self.terms = JobTerms()   # each job's own account, QOS and time limit
        self.allocations = GroupAllocations(
            store, backend, pools, driver, self.node_retries, tag=self.tag,
            immediate_s=immediate_s, fail_placed=self._fail_placed, end_step=self._end_step,
            charge=site.slurm, terms=self.terms)
        self.placer = Placer(store, capacity, self.policy, site, instance,
                             lambda seconds: self.on_placement and self.on_placement(seconds),
                             accounting)
        self.usage = UsageMeter(store, CostRates.from_site(site), driver)
        self.outputs = JobOutputs(store, self.terms, driver.live, open_output)   # -o, -e
        # re-planning running jobs (daemon/replanning.py): only where jobs can be moved
        # (with co-location off: a running member keeps its way, daemon/colocating.py)
        self.replanner = None if replan is None else Replanner(
            store, colocating.running(capacity), self.policy, instance, replan, driver.live,
            clock.now())
        if self.replanner is not None:   # recent arrivals re-placed with new ones
            self.placer.with_arrivals = self.replanner.with_arrivals
        self.ticks = 0
        # since when reading the world (squeue) fails, and the last error in words
        self.world_error: tuple[float, str] | None = None

    # -- the tick ----------------------------------------------------------------------

    def tick(self) -> None:
        """One pass: read the world (or skip the tick), then each act, failures isolated."""
        try:
            world = self._read_world()
        except WeaveError as exc:   # a failing or hung squeue: say so, try next tick
            since = self.world_error[0] if self.world_error else self.clock.now()
            self.world_error = (since, in_words(exc))
            raise
        self.world_error = None
        now = self.clock.now()
        acts: list[Callable[[], None]] = [lambda: self._reconcile_allocs(world, now),
                    lambda: self._reconcile_steps(world, now),
                    lambda: self._drive(now),
                    lambda: self._end_overdue(now),
                    lambda: self._finish_cancelled(now),
                    lambda: self.placer.place(now),
                    lambda: self.replanner.tick(now) if self.replanner else None,
                    lambda: self.allocations.ensure(now),
                    lambda: self.allocations.return_surplus(now),
                    lambda: self.allocations.give_back_spare(now),
                    lambda: self._launch_node_daemons(world, now),
                    lambda: self._activate_groups(now),
                    lambda: self._launch_jobs(world, now),
                    lambda: self._drain_groups(now),
                    lambda: self.usage.advance(now),
                    lambda: self.outputs.advance(now)]
        for act in acts:
            try:
                act()
            except WeaveError as exc:
                log.warning("reconcile: %s", exc)
            except Exception:
                log.exception("reconcile: unexpected error; continuing with the next step")
        self.ticks += 1

    def _read_world(self) -> World:
        world = World()
        for a in self.backend.list_allocations(self.prefix, instance=self.tag):
            world.allocations[a.alloc_id] = a
            world.steps[a.alloc_id] = {s.name for s in self.backend.list_steps(a.alloc_id)}
        return world

    # -- reconciling the store with the world ------------------------------------------

    def _reconcile_allocs(self, world: World, now: float) -> None:
        claimed = {a.alloc_id for a in self.store.allocs() if a.alloc_id}
        for row in self.store.allocs():
            group = self.store.group(row.group_id)
            if group is None:
                continue
            if row.state is AllocState.ALLOCATING:  # a crash between intent and result
                name = self.allocations.request(group, row).job_name
                found = [a for a in world.allocations.values()
                         if a.name == name and a.alloc_id not in claimed
                         and a.state is not AllocationState.ENDING]
                if found:
                    claimed.add(found[0].alloc_id)
                    self.allocations.held(row, found[0], now,
                                          "adopted: Slurm lists it after a restart")
                else:
                    self.store.transition("alloc", row.key, AllocState.WANTED,
                                          "not in Slurm after a restart; ask again", now)
            elif row.state is AllocState.HELD and not _still_held(world, row.alloc_id):
                # ending in Slurm without weaved's release: killed on a failed node (it
                # stays COMPLETING until that node answers again), timed out, scancelled
                ending = row.alloc_id in world.allocations
                why = (f"{row.role} allocation {row.alloc_id} (node(s) "
                       f"{','.join(row.nodes) or '?'}) "
                       + ("was ended by Slurm, not released by weaved" if ending
                          else "vanished from Slurm"))
                self.store.transition("alloc", row.key, AllocState.LOST, why, now)
                for job in self.store.jobs([JobState.RUNNING, JobState.PLACED],
                                           group_id=row.group_id):
                    self.store.update("job", job.job_id, reason=f"{why}; asking for a new "
                                      "allocation, then re-admitting from checkpoint")
            elif row.state is AllocState.HELD and set(row.gone) & set(
                    world.allocations[row.alloc_id or ""].nodes):
                self.allocations.shrink(row)   # written as given back: Slurm shrinks it
            elif row.state is AllocState.RELEASING:
                self.allocations.release(row, now)
        gone = {a.alloc_id for a in self.store.allocs(live_only=False)
                if a.alloc_id and a.state is AllocState.RELEASED}
        for alloc_id, a in world.allocations.items():
            if alloc_id not in claimed and (alloc_id in gone
                                            or a.state is AllocationState.ENDING):
                log.debug("allocation %s is ending in Slurm", alloc_id)
            elif alloc_id not in claimed:
                log.warning("releasing orphan allocation %s (%s, ours: uid and instance "
                            "%s): no group in the store", alloc_id, a.name, self.tag)
                self.backend.release(alloc_id)

    def _reconcile_steps(self, world: World, now: float) -> None:
        allocs = {a.key: a for a in self.store.allocs(live_only=False)}
        for step in self.store.steps():
            alloc = allocs.get(step.alloc_key)
            if alloc is None or alloc.state is not AllocState.HELD or alloc.alloc_id is None:
                self._end_step(step, now, "its allocation is gone")
                continue
            listed = step.name in world.steps.get(alloc.alloc_id, set())
            if step.state is StepRunState.LAUNCHING:
                if listed:
                    self.store.transition("step", step.key, StepRunState.RUNNING,
                                          "adopted: Slurm lists it after a restart", now)
                else:
                    self._end_step(step, now, "not in Slurm after a restart")
            elif step.state is StepRunState.STOPPING:
                self._stop_step(step, alloc, now)
            elif step.state is StepRunState.RUNNING:
                self._check_running(step, alloc, listed, now, world)

    def _check_running(self, step: StepRow, alloc: AllocRow, listed: bool, now: float,
                       world: World) -> None:
        handle = self._handles.get(step.key)
        if handle is not None:  # launched by this process: its launcher tells the truth
            status = self.backend.poll_step(handle)
            why = "" if status.state is StepState.RUNNING else \
                f"exited with code {status.returncode}" if status.returncode is not None \
                else f"ended ({status.state.value})"
            ok = status.state is StepState.COMPLETED
        else:
            why, ok = "" if listed else "vanished from the backend", False
        if not why:
            if step.job_id is None:
                self._node_steady(alloc, now)
            return
        self._end_step(step, now, why)
        if step.job_id is not None:
            job = self.store.job(step.job_id)
            if job is not None and job.state is JobState.RUNNING \
                    and not (ok and self.store.steps(job_id=job.job_id)):   # none left
                self._finish_job(job, JobState.COMPLETED if ok else JobState.FAILED,
                                 f"step {step.name} {why}", now)
            return
        if handle is not None and listed:   # a backend that still lists the dead step
            self.backend.cancel_step(handle)   # would make the relaunch adopt it
            world.steps.get(alloc.alloc_id or "", set()).discard(step.name)
        self._node_daemon_failed(alloc, why, now, with_log=True)

    def _node_daemon_failed(self, alloc: AllocRow, why: str, now: float,
                            with_log: bool = False) -> None:
        """Back off its relaunch and say why on its group's jobs; at the bound, fail them."""
        group = self.store.group(alloc.group_id)
        path = self.node_step(group, alloc).log_path \
            if with_log and group is not None and self.node_step is not None else None
        verdict = self.node_retries.failed(alloc, why, now, path)
        log.warning("%s", verdict.reason)
        for job in self.store.jobs([JobState.RUNNING, JobState.PLACED], group_id=alloc.group_id):
            if verdict.give_up:
                self._finish_job(job, JobState.FAILED, verdict.reason, now)
            else:
                self.store.update("job", job.job_id, reason=verdict.reason)

    def _node_steady(self, alloc: AllocRow, now: float) -> None:
        """A node daemon that failed before and has run long enough since: clear the
        reason its failures gave its jobs (where it still stands)."""
        said = self.node_retries.steady(alloc.key, now)
        for job in self.store.jobs([JobState.RUNNING, JobState.PLACED], group_id=alloc.group_id):
            if said is not None and job.reason == said:
                self.store.update("job", job.job_id, reason="")

    def _end_step(self, step: StepRow, now: float, reason: str) -> None:
        self.store.transition("step", step.key, StepRunState.ENDED, reason, now)
        self._handles.pop(step.key, None)

    def _stop_step(self, step: StepRow, alloc: AllocRow, now: float) -> None:
        if step.state is not StepRunState.STOPPING:
            self.store.transition("step", step.key, StepRunState.STOPPING, "stopping", now)
        crossing(FaultPoint.CANCEL_STOPPING)
        if alloc.alloc_id is not None and alloc.state is AllocState.HELD:
            handle = self._handles.get(step.key) or StepHandle(alloc.alloc_id, step.name,
                                                               step.launcher_pid or 0)
            self.backend.cancel_step(handle)
        self._end_step(step, now, "cancelled")

    def _drive(self, now: float) -> None:
        """Let the driver sync its groups with the store; apply the jobs that ended."""
        for outcome in self.driver.drive(self.store, now):
            job = self.store.job(outcome.job_id)
            if job is not None and job.state is JobState.RUNNING:
                crossing(FaultPoint.JOB_ENDED)
                self._finish_job(job, outcome.state, outcome.reason, now,
                                 outcome.weights_sha256)

    # -- jobs leaving ------------------------------------------------------------------

    def _finish_job(self, job: JobRow, dst: JobState, reason: str, now: float,
                    weights_sha256: str | None = None) -> None:
        """Stop the job's steps, take it out of its group, then record ``dst`` (PENDING:
        requeued, to be placed again: daemon/waits.py; and the digest of its final
        weights, in the same transaction)."""
        allocs = {a.key: a for a in self.store.allocs(live_only=False)}
        for step in self.store.steps(job_id=job.job_id):
            self._stop_step(step, allocs[step.alloc_key], now)
        with self.store.held():   # a status read sees it in its group or ended
            if job.group_id is not None:
                self._leave_group(job, now)
            crossing(FaultPoint.CANCEL_STOPPED)
            fields = {"ended_s": now} if dst.final else {"group_id": None, "started_s": None}
            self.store.transition("job", job.job_id, dst, reason, now, expect=job.state,
                                  weights_sha256=weights_sha256, **fields)
            self.store.update("job", job.job_id, reason=reason)   # status shows why it ended

    def _leave_group(self, job: JobRow, now: float) -> None:
        group = self.store.group(job.group_id or 0)
        if group is None or group.state.final or (job.job_id not in group.plan.job_ids
                                                  and job.job_id not in group.plan.next_ids):
            return
        capacity, jobs = colocating.running(self.capacity), self.store.jobs(_LIVE_JOB)
        free = 0
        if group.plan.rollout_gpus is not None:   # a pool: what a new row may count on
            allocs = by_group(self.store.allocs(live_only=False))
            free = membership.free_rollout_gpus(capacity, self.store.groups(), jobs,
                                                self.store.next_group_id(), allocs)
        plan = membership.plan_without(capacity, group, jobs, self.store.next_group_id(),
                                       job.job_id,
                                       self.store.allocs(group.group_id, live_only=False),
                                       self.replanner.remaining
                                       if self.replanner is not None else None, free)
        self.store.update("group", group.group_id, plan=(plan or GroupPlan(
            group.plan.rollout_nodes, group.plan.train_nodes, ())).to_json())
        if plan is None and group.state is not GroupState.DRAINING:
            self.store.transition("group", group.group_id, GroupState.DRAINING,
                                  f"its last member (job {job.job_id}) left", now)
        elif plan is not None and self.replanner is not None:
            self.replanner.left(group.group_id)

    def _end_overdue(self, now: float) -> None:
        """End the RUNNING jobs that reached their own time limit (``#SBATCH --time``)."""
        for job, reason in self.terms.overdue(self.store.jobs([JobState.RUNNING]), now):
            log.info("job %s: %s", job.job_id, reason)
            self._finish_job(job, JobState.FAILED, reason, now)

    def _fail_placed(self, group_id: int, reason: str, now: float) -> None:
        for job in self.store.jobs([JobState.PLACED], group_id=group_id):
            self._finish_job(job, JobState.FAILED, reason, now)

    def _finish_cancelled(self, now: float) -> None:
        for job in self.store.jobs([JobState.CANCELLING]):
            self._finish_job(job, JobState.CANCELLED, "cancelled by its owner", now)

    # -- steps -------------------------------------------------------------------------

    def _launch(self, alloc: AllocRow, job_id: int | None, spec: StepSpec, world: World,
                now: float) -> str | None:
        """Write the intent, then launch (or adopt a step of that name Slurm already runs);
        the error in words if the launch failed."""
        key = self.store.add_step(alloc_key=alloc.key, job_id=job_id, name=spec.name,
                                  now=now, reason=f"launching in {alloc.alloc_id}")
        if spec.name in world.steps.get(alloc.alloc_id or "", set()):
            self.store.transition("step", key, StepRunState.RUNNING, "adopted", now)
            return None
        crossing(FaultPoint.STEP_INTENT)
        try:
            handle = self.backend.launch_step(alloc.alloc_id or "", spec)
        except WeaveError as exc:
            self.store.transition("step", key, StepRunState.ENDED, f"launch failed: {exc}", now)
            log.warning("launching %s in %s failed: %s", spec.name, alloc.alloc_id, exc)
            return in_words(exc)
        self._handles[key] = handle
        crossing(FaultPoint.STEP_LAUNCHED)
        self.store.transition("step", key, StepRunState.RUNNING, "launched", now,
                              launcher_pid=handle.launcher_pid)
        return None

    def _launch_node_daemons(self, world: World, now: float) -> None:
        if self.node_step is None:
            return
        for group in self.store.groups():
            if group.state not in (GroupState.FORMING, GroupState.ACTIVE):
                continue   # a draining group's allocations are about to be released
            for alloc in self.store.allocs(group.group_id):
                if alloc.state is not AllocState.HELD \
                        or not self.node_retries.ready(alloc.key, now) \
                        or any(s.job_id is None for s in self.store.steps(alloc_key=alloc.key)):
                    continue
                spec = self.node_step(group, alloc)
                self.node_retries.launching(alloc.key, spec.log_path, now)
                error = self._launch(alloc, None, spec, world, now)
                if error is not None:
                    self._node_daemon_failed(alloc, f"could not be launched ({error})", now)

    def _node_daemons_up(self, allocs: Sequence[AllocRow]) -> bool:
        if self.node_step is None:
            return True
        return all(any(s.job_id is None and s.state is StepRunState.RUNNING
                       for s in self.store.steps(alloc_key=a.key)) for a in allocs)

    def _activate_groups(self, now: float) -> None:
        for group in self.store.groups():
            if group.state is not GroupState.FORMING:
                continue
            allocs = self.store.allocs(group.group_id)
            if allocs and all(a.state is AllocState.HELD for a in allocs) \
                    and self._node_daemons_up(allocs):
                self.store.transition("group", group.group_id, GroupState.ACTIVE,
                                      f"allocations {[a.alloc_id for a in allocs]} held", now)
                crossing(FaultPoint.GROUP_ACTIVE)

    def _launch_jobs(self, world: World, now: float) -> None:
        for group in self.store.groups():
            if group.state is not GroupState.ACTIVE:
                continue
            allocs = self.store.allocs(group.group_id, live_only=False)
            for job in self.store.jobs([JobState.PLACED], group_id=group.group_id):
                steps = self.driver.job_steps(job, group, allocs)
                errors = [e for s in steps
                          if (e := self._launch(s.alloc, job.job_id, s.spec, world, now))]
                ok = not errors
                fresh = self.store.job(job.job_id)
                if fresh is None or fresh.state is not JobState.PLACED:
                    continue  # cancelled meanwhile: the next tick stops its steps
                if ok:
                    self.store.transition("job", job.job_id, JobState.RUNNING,
                                          f"{len(steps)} step(s) launched", now,
                                          expect=JobState.PLACED, started_s=now)
                    if fresh.reason:   # e.g. a "waiting: ... retrying" that no longer holds
                        self.store.update("job", job.job_id, reason="")
                    crossing(FaultPoint.JOB_RUNNING)
                else:
                    self._finish_job(fresh, JobState.FAILED, "a step could not be launched: "
                                     f"{errors[0]}", now)

    def _drain_groups(self, now: float) -> None:
        for group in self.store.groups():
            if group.state is not GroupState.DRAINING:
                continue
            # a member cancelled as the group's last one is still in the runtime: its
            # state on the nodes must be dropped before their daemons stop
            self.driver.release_group(group.group_id)
            for alloc in self.store.allocs(group.group_id):
                for step in self.store.steps(alloc_key=alloc.key):
                    self._end_step(step, now, "group released")
                self.allocations.release(alloc, now)
            self.store.transition("group", group.group_id, GroupState.RELEASED,
                                  "allocations released", now)
