"""A group's Slurm allocations: asked for, held and returned (the reconcile loop's acts).

:class:`GroupAllocations` carries out what :func:`~weave_slurm.daemon.allocplan.needs`
says a group's plan needs, write-ahead like every act of the loop: a row is WANTED
before anything is asked, ALLOCATING before ``sbatch`` runs, RELEASING before the
release call. A group that needs another allocation (rollout scaling, a lost one
replaced) goes FORMING until it is held and its node daemons run. An allocation no
member is pinned to any more (the group shrank) is returned once no job step runs in
it and the driver no longer uses its nodes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from weave_slurm.config.site import SlurmConfig
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.driver import Driver
from weave_slurm.daemon.fault_points import FaultPoint, crossing
from weave_slurm.daemon.job_terms import JobTerms
from weave_slurm.daemon.records import AllocRow, GroupRow, StepRow
from weave_slurm.daemon.retries import Backoff, NodeDaemonRetries, in_words
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import InfeasibleRequest, InsufficientResources, WeaveError
from weave_slurm.slurm.backend import Allocation, AllocationRequest, Backend, ResourceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolRequest:
    """How a group's allocations of one role are shaped (from the site config)."""

    partition: str
    gpus_per_node: int
    gpu_type: str | None
    cpus_per_node: int


def alloc_request(group: GroupRow, alloc: AllocRow, immediate_s: int,
                  tag: str) -> AllocationRequest:
    """What ``sbatch`` asks for a row: its shape (a share's GPUs and CPUs as the row
    holds them), and what the row says it is charged to (written when it was wanted: a
    restart asks the same)."""
    return AllocationRequest(group.label, alloc.pool, (ResourceSpec(
        alloc.partition, alloc.node_count, alloc.gpus_per_node, alloc.gpu_type,
        alloc.cpus_per_node),), immediate_s=immediate_s, instance=tag,
        time_limit_min=alloc.time_limit_min, account=alloc.account, qos=alloc.qos)


#: How long (s) a rollout allocation may pend before it is asked again while a pool of
#: this weaved still gives nodes back (daemon/room.py): it likely waits for those nodes,
#: and weaved's loop, which the give-back needs, waits for it meanwhile.
GIVING_BACK_IMMEDIATE_S = 1

#: Fail a group's PLACED jobs with this reason (Slurm refuses its allocation as asked).
FailPlaced = Callable[[int, str, float], None]
#: End a step row with this reason (its allocation is being returned).
EndStep = Callable[[StepRow, float, str], None]


class GroupAllocations:
    """Obtains and returns the allocations of every forming or active group."""

    def __init__(self, store: Store, backend: Backend, pools: dict[str, PoolRequest],
                 driver: Driver, node_retries: NodeDaemonRetries, *, tag: str,
                 immediate_s: int, fail_placed: FailPlaced, end_step: EndStep,
                 charge: SlurmConfig | None = None, terms: JobTerms | None = None) -> None:
        self.store, self.backend, self.pools, self.driver = store, backend, pools, driver
        self.charge = charge or SlurmConfig()   # the site's account, QOS, time limit
        self.terms = terms or JobTerms()   # the members' own (#SBATCH -A/-q/-t)
        self.node_retries, self.tag, self.immediate_s = node_retries, tag, immediate_s
        self.fail_placed, self.end_step = fail_placed, end_step
        self.retry = Backoff()   # per alloc key: failed or hung allocate calls

    def request(self, group: GroupRow, alloc: AllocRow,
                immediate_s: int | None = None) -> AllocationRequest:
        return alloc_request(group, alloc, immediate_s or self.immediate_s, self.tag)

    def held(self, row: AllocRow, a: Allocation, now: float, reason: str) -> None:
        self.store.transition("alloc", row.key, AllocState.HELD, reason, now,
                              expect=AllocState.ALLOCATING, alloc_id=a.alloc_id,
                              nodes=json.dumps(list(a.nodes)), updated_s=now)

    # -- asking ------------------------------------------------------------------------

    def ensure(self, now: float) -> None:
        """Ask for what each group's plan needs (pins off lost nodes first). While a pool
        still has nodes to give back, a rollout allocation pends for at most
        :data:`GIVING_BACK_IMMEDIATE_S` before it is asked again."""
        groups = self._groups()
        held = {g.group_id: self.store.allocs(g.group_id, live_only=False) for g in groups}
        giving_back = any(allocplan.spare_nodes(g.plan, held[g.group_id]) for g in groups)
        for group in groups:
            rows = held[group.group_id]   # only this group's own acts below change them
            needs = allocplan.needs(group.plan, rows)
            if needs.plan != group.plan:   # before the rows that hold its new slots
                self.store.update("group", group.group_id, plan=needs.plan.to_json())
            for want in needs.wants:
                self._want(group, want, sum(a.role == want.role for a in rows), now)
            unneeded = {a.key for a in needs.surplus}   # returned instead (return_surplus)
            for alloc in self.store.allocs(group.group_id):
                if alloc.state is AllocState.WANTED and alloc.key not in unneeded \
                        and self.retry.ready(alloc.key, now):
                    if not self._wants_nodes(group.group_id):
                        break   # a sibling's refusal failed its members: it is draining
                    short = giving_back and alloc.role == allocplan.ROLLOUT
                    self._allocate(group, alloc, now,
                                   min(self.immediate_s, GIVING_BACK_IMMEDIATE_S) if short
                                   else None)

    def _groups(self) -> list[GroupRow]:
        return [g for g in self.store.groups()
                if g.state in (GroupState.FORMING, GroupState.ACTIVE)]

    def _wants_nodes(self, group_id: int) -> bool:
        """The group's state now (the loop's row may be stale): forming or active."""
        group = self.store.group(group_id)
        return group is not None and group.state in (GroupState.FORMING, GroupState.ACTIVE)

    def _want(self, group: GroupRow, want: allocplan.Want, seq: int, now: float) -> None:
        role, nodes, pool = want.role, want.nodes, self.pools[want.role]
        members = self.store.jobs([JobState.PLACED, JobState.RUNNING], group_id=group.group_id)
        terms = self.terms.alloc_terms(self.charge, members, now)
        kind = "replacement for a lost" if want.replaces else \
            "rollout scaling: extra" if role == "rollout" and seq else "initial"
        shape = allocplan.row_shape(pool.gpus_per_node, pool.cpus_per_node, want.gpus)
        share = f", {shape.gpus_per_node} GPUs of each" \
            if shape.gpus_per_node < pool.gpus_per_node else ""
        self.store.add_alloc(group_id=group.group_id, role=role,
                             pool=f"{pool.partition}-{seq}", partition=pool.partition,
                             node_count=nodes, gpus_per_node=shape.gpus_per_node,
                             gpu_type=pool.gpu_type, cpus_per_node=shape.cpus_per_node,
                             now=now, reason=f"{kind} {role} allocation of {nodes} node(s)"
                                             f"{share}",
                             account=terms.account, qos=terms.qos,
                             time_limit_min=terms.time_limit_min)
        fresh = self.store.group(group.group_id)   # a first _want this tick made it FORMING
        if fresh is not None and fresh.state is GroupState.ACTIVE:
            self.store.transition("group", group.group_id, GroupState.FORMING,
                                  f"needs {nodes} more {role} node(s)"
                                  + self._lost(group, role, want.replaces), now)

    def _lost(self, group: GroupRow, role: str, replaces: bool) -> str:
        """For a replacement: what became of the allocation it replaces (its LOST
        reason), so that ``weave show group`` keeps the fault once the jobs' reasons
        have moved on."""
        if not replaces:
            return ""
        lost = [a for a in self.store.allocs(group.group_id, live_only=False)
                if a.role == role and a.state is AllocState.LOST]
        if not lost:
            return ""
        last = self.store.transitions("alloc", max(a.key for a in lost))
        return f": {last[-1].reason}" if last else ""

    def _allocate(self, group: GroupRow, alloc: AllocRow, now: float,
                  immediate_s: int | None = None) -> None:
        request = self.request(group, alloc, immediate_s)
        self.store.transition("alloc", alloc.key, AllocState.ALLOCATING,
                              f"requesting {request.job_name}", now, expect=AllocState.WANTED)
        crossing(FaultPoint.ALLOC_INTENT)
        try:
            granted = self.backend.allocate(request)
        except InfeasibleRequest as exc:
            self.store.transition("alloc", alloc.key, AllocState.FAILED, str(exc), now)
            self.fail_placed(group.group_id, f"group {group.group_id}: {exc}", now)
            return
        except (InsufficientResources, WeaveError) as exc:
            n, wait = self.retry.failed(alloc.key, now)
            why = f"{alloc.role} allocation {request.job_name} not granted ({in_words(exc)}); " \
                  f"attempt {n}, retrying in {wait:g} s"
            self.store.transition("alloc", alloc.key, AllocState.WANTED, why, now)
            for job in self.store.jobs([JobState.PLACED], group_id=group.group_id):
                self.store.update("job", job.job_id, reason=f"waiting: {why}")
            return
        self.retry.forget(alloc.key)
        crossing(FaultPoint.ALLOC_GRANTED)
        self.held(alloc, granted, now, f"granted as {granted.alloc_id}")

    # -- returning ---------------------------------------------------------------------

    def return_surplus(self, now: float) -> None:
        """Release the rollout allocations no member is pinned to any more, once no job
        step runs in them and the driver no longer uses their nodes (its members have
        moved off them)."""
        for group in self._groups():
            rows = self.store.allocs(group.group_id, live_only=False)
            for row in allocplan.needs(group.plan, rows).surplus:
                if row.state is AllocState.ALLOCATING:
                    continue   # its call may be under way: returned once it is held
                steps = self.store.steps(alloc_key=row.key)
                if any(s.job_id is not None for s in steps) \
                        or self._keys(row) & self.driver.in_use(group.group_id):
                    continue
                for step in steps:
                    self.end_step(step, now, "its allocation is no longer needed")
                why = (f"no member of group {group.group_id} is pinned to its node(s) "
                       f"{','.join(row.nodes) or '-'} any more")
                log.info("group %s: returning %s allocation %s: %s", group.group_id,
                         row.role, row.alloc_id or row.pool, why)
                self.release(row, now, why)

    def give_back_spare(self, now: float) -> None:
        """Give back to Slurm the nodes of a pooled group's rows that its plan no longer
        pins (allocplan's "Spare nodes"), once no job step runs in the row and the driver
        no longer uses them (its members re-pinned off them at a phase boundary): their
        node daemons are told to end (``Driver.leave``: each drops its state and root
        before Slurm would SIGKILL it), the nodes are written as given back, and the
        next tick's reconcile asks Slurm to shrink the allocation to the rest
        (:meth:`shrink`: whenever Slurm still lists a node written as given back, after
        a restart too), once the daemons had a tick to end."""
        for group in self._groups():
            rows = self.store.allocs(group.group_id, live_only=False)
            for row, nodes in allocplan.spare_nodes(group.plan, rows):
                if row.state is not AllocState.HELD or row.alloc_id is None:
                    continue
                gpus = self.pools[row.role].gpus_per_node
                keys = {allocplan.node_key(row, n, gpus) for n in nodes}
                if keys & self.driver.in_use(group.group_id) or any(
                        s.job_id is not None for s in self.store.steps(alloc_key=row.key)):
                    continue
                try:
                    self.driver.leave(row, nodes)   # their node daemons end themselves
                except WeaveError as exc:   # not reachable: Slurm's shrink ends them
                    log.warning("group %s: node daemons on %s: %s", group.group_id,
                                ",".join(nodes), exc)
                gone = [*zip(row.gone, row.gone_s, strict=True), *((n, now) for n in nodes)]
                why = (f"gave back node(s) {','.join(nodes)} to Slurm: no member of group "
                       f"{group.group_id} is pinned to them any more (a narrower pool)")
                self.store.update("alloc", row.key, gone=json.dumps(gone), reason=why,
                                  updated_s=now)
                log.info("group %s: %s allocation %s: %s", group.group_id, row.role,
                         row.alloc_id, why)

    def shrink(self, row: AllocRow) -> None:
        """Ask Slurm to hold only ``row``'s nodes not given back (``AllocRow.gone``)."""
        if row.alloc_id is not None and row.held_nodes:
            self.backend.shrink(row.alloc_id, row.held_nodes)

    def _keys(self, row: AllocRow) -> set[str]:
        """How the driver names ``row``'s nodes (a share's: its node daemons' keys, so
        another share of the same node in use keeps only its own row)."""
        gpus = self.pools[row.role].gpus_per_node
        return {allocplan.node_key(row, n, gpus) for n in row.held_nodes}

    def release(self, alloc: AllocRow, now: float, why: str = "") -> None:
        if alloc.state is AllocState.WANTED:
            self.store.transition("alloc", alloc.key, AllocState.RELEASED, why or "not needed",
                                  now)
            return
        if alloc.state is AllocState.HELD:
            self.store.transition("alloc", alloc.key, AllocState.RELEASING,
                                  f"releasing {alloc.alloc_id}" + (f": {why}" if why else ""),
                                  now)
        crossing(FaultPoint.RELEASE_INTENT)
        if alloc.alloc_id is not None:
            self.backend.release(alloc.alloc_id)
        crossing(FaultPoint.RELEASE_DONE)
        self.store.transition("alloc", alloc.key, AllocState.RELEASED, "released", now,
                              updated_s=now)
        self.node_retries.forget(alloc.key)
        self.retry.clear()   # nodes were freed: waiting allocations may ask again now
