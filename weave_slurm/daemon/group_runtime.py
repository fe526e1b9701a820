"""The group runtime inside weaved: one runtime per active group, behind its port.

:class:`GroupRuntime` implements the reconcile loop's :class:`Driver` seam. It keeps
only the mapping between the store's rows and the runtimes' members (and how the
members of a group that lost nodes go on, until it is active again) plus its thread;
a member's life cycle is the runtime's (:mod:`weave_slurm.runtime.lifecycle`), driven
only through its :class:`~weave_slurm.runtime.port.GroupPort`: store rows become
commands (:mod:`~weave_slurm.runtime.port_commands`), the events it reports become outcomes,
and status reads its member snapshots. A placed job needs no step of its own
(``job_steps`` returns none): its phases run in resident workers on the node daemons
weaved launched for its group's allocations.

- :meth:`GroupRuntime.drive` (called by the reconcile loop, which owns the store)
  builds a group's runtime once its node daemons answer, joins each RUNNING job
  (spec: entry point, seed, iterations, options; pins from the group's plan), makes
  cancelled and ended jobs leave (their workers, segments and checkpoints dropped
  on every node), and reports members that reached their iterations (COMPLETED) or
  gave up (FAILED). After a weaved restart a RUNNING job whose warm state is still
  on its training node is re-attached: re-admitted from its newest node checkpoint.
- The runtime follows the group's plan and allocations (:meth:`GroupRuntime._follow`):
  the nodes of an allocation newly held for it (rollout scaling) are added to the
  running runtime once their node daemons answer (``Extend``; members keep
  running, a scaled-in job then joins on them), a member the plan moved is re-pinned at
  its next phase boundary, and a node no member is on any more (the group shrank) is
  retired, after which the reconcile loop returns its allocation (:meth:`in_use`). A
  lost allocation instead detaches the runtime: its members are re-admitted from their
  checkpoints on a rebuilt one. A co-located group (``GroupPlan.colocated``) has no
  rollout node: its runtime is built on its training nodes alone, its member joins with
  no pin (it rolls out on its training node) and is never re-pinned
  (:mod:`~weave_slurm.daemon.colocating`). A pin names a slot of the group's allocations
  (:mod:`~weave_slurm.daemon.allocplan`), so it names the same node across all of this
  and across weaved restarts, where the runtime is built from the store's allocations
  and plan.
- Each group's runtime has a worker thread of its own (:meth:`start`,
  :mod:`~weave_slurm.daemon.group_workers`): it ticks the group's port every ``poll_s``,
  so phases hand over in milliseconds while the reconcile loop ticks once a second, and
  wakes the loop when a member ends (a ``MemberEnded`` event). :meth:`drive` hands each
  group's membership work to that worker and waits ``drive_wait_s`` at most: a group
  whose node calls block holds only itself, never another group's phases, joins or
  re-attach, nor a status read (docs/reliability.md, C2). Moves between groups are done
  by the reconcile loop under the locks of the groups they touch.
- :meth:`live` is what ``weave status`` / ``weave show job`` read: phase, version,
  the four measured quantities, live slowdown vs SLO and drift flags (a snapshot
  refreshed by the runtime thread; API threads never touch a node daemon).
- Live profiles feed back into placement: once a member has enough measured phases
  and they moved, :meth:`drive` stores them as the job's planning profile
  (:func:`~weave_slurm.runtime.profiler.planning_profile`), which the next placement
  decisions (arrivals packed next to it, consolidation) use instead of the declared one.
"""


from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weave_slurm.daemon import allocplan, feedback, member_exit, pooling
from weave_slurm.daemon.driver import JobOutcome, JobStep, pool_nodes
from weave_slurm.daemon.group_workers import GroupSlot, Rounds, Workers, acquire_all
from weave_slurm.daemon.handoff import Handoffs
from weave_slurm.daemon.member_specs import member_spec
from weave_slurm.daemon.node_answers import first_silent, tell_to_leave
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow
from weave_slurm.daemon.runtime_view import LiveRows, member_row
from weave_slurm.daemon.states import GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.waits import Deadlines, GroupWaits, WaitCause, answer_cause
from weave_slurm.errors import WeaveError
from weave_slurm.runtime import port_commands as cmd
from weave_slurm.runtime.agents import Launcher
from weave_slurm.runtime.group import GroupLayout, MemberState, NodeRef
from weave_slurm.runtime.member import RunnerConfig
from weave_slurm.runtime.nodes import Resolver
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_events import Detached, MemberChanged, MemberEnded
from weave_slurm.runtime.resume import Resume, ResumeKind
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.runtime.timeline import Span, TimelineObserver
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

_ENDED = (JobState.CANCELLING, JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED)
_GONE = (MemberState.CANCELLED, MemberState.DONE, MemberState.FAILED)


@dataclass(frozen=True)
class GroupRuntimeConfig:
    """Its own pacing; every site setting is its runner's (the ``[runtime]`` table)."""

    poll_s: float = 0.01           # a group's worker ticks this often when nothing changed
    # the reconcile loop waits this long for the groups' membership work; a group whose
    # node calls take longer (they block on its nodes) reports on a later tick
    drive_wait_s: float = 0.5
    snapshot_s: float = 0.2        # how often the status snapshot is refreshed
    ping_timeout_s: float = 2.0    # a node daemon must answer this fast to build a group
    # each node daemon's checkpoint root is <checkpoint_base>/<node>, on a file system
    # weaved shares with the nodes: a member whose training node is lost is re-admitted
    # on the replacement from its last checkpoint there (None: it fails instead)
    checkpoint_base: Path | None = None
    runner: RunnerConfig = field(default_factory=RunnerConfig)

    @property
    def plan_from_measurements(self) -> bool:   # feed measured profiles to placement
        return self.runner.plan_from_measurements

    @property
    def move_wait_s(self) -> float:   # a move waiting for its nodes is withdrawn then
        return self.runner.move_wait_s

    @property
    def deadlines(self) -> Deadlines:   # how long a group may wait for its node daemons
        return Deadlines(self.runner)


class GroupRuntime:
    """The :class:`~weave_slurm.daemon.driver.Driver` that runs RL phases."""

    phase = "rl"

    def __init__(self, node_ref: Callable[[AllocRow, str, Pool], NodeRef],
                 config: GroupRuntimeConfig | None = None,
                 launcher: Launcher | None = None, resolve: Resolver | None = None,
                 observer: TimelineObserver | None = None,
                 node_key: Callable[[AllocRow, str], str] | None = None) -> None:
        self.node_ref = node_ref
        # a row's node as node_ref names it (a share's: its daemon's key; None: the node)
        self.key = node_key or (lambda alloc, node: node)
        self.observer = observer        # told each runner's phases and copies (metrics)
        self.launcher = launcher        # how sync agents start on remote nodes
        self.resolve = resolve          # a remote node daemon's current port
        self.config = config or GroupRuntimeConfig()
        # active groups' runtimes: set and popped by their workers (one each), read by
        # anyone (a dict's get, set, pop and copy are atomic)
        self.ports: dict[int, GroupPort] = {}
        self.spans: dict[int, list[Span]] = {}         # group id -> spans (kept after end)
        self.wake: Callable[[], None] = lambda: None
        self.workers = Workers(self._tick, self.config.poll_s)   # one per active group
        self._rounds = Rounds()                        # membership work handed out
        self.rows = LiveRows(self.config.snapshot_s)   # status: each job's last row
        self._resume: dict[int, Resume] = {}    # job -> how it goes on (its group lost nodes)
        self.waits = GroupWaits(self.config.deadlines)   # groups not reaching their nodes
        self.moves = Handoffs({}, self._resume, self.waits.jobs,
                              self.config.checkpoint_base, self.config.move_wait_s)

    @property
    def groups(self) -> dict[int, GroupRunner]:
        """The runners of the active groups, for tests that look inside; weaved drives
        them through :attr:`ports`, and reads their timelines there (metrics)."""
        return {gid: port.runner for gid, port in dict(self.ports).items()}

    # -- the Driver seam -------------------------------------------------------------
    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]:
        return []

    def drive(self, store: Store, now: float) -> list[JobOutcome]:
        """Membership from the store: join, leave, and the jobs that ended. Each group's
        part is its worker's (:meth:`_round`); the moves between groups follow here."""
        live_groups = {g.group_id: g for g in store.groups()}
        slots = self.workers.slots(gid for gid, g in live_groups.items()
                                   if g.state is GroupState.ACTIVE)
        rows = {gid: store.allocs(gid, live_only=False) for gid in live_groups}
        for gid, slot in slots.items():
            group = live_groups.get(gid)
            if group is None or group.state in (GroupState.DRAINING, GroupState.RELEASED):
                self._rounds.hand(slot, functools.partial(self._end_slot, slot))
                continue
            jobs = [j for j in store.jobs(group_id=gid) if not _moving(j, gid)]
            self._rounds.hand(slot, functools.partial(self._round, slot, group, rows[gid],
                                                      jobs, store, now))
        outcomes = self._rounds.finished(self.config.drive_wait_s)
        outcomes += self.waits.overdue(store, now)
        if self.moves.pending(store):
            outcomes += self._moves(store, live_groups, rows, now)
        return outcomes

    def _round(self, slot: GroupSlot, group: GroupRow, allocs: Sequence[AllocRow],
               jobs: Sequence[JobRow], store: Store, now: float) -> list[JobOutcome]:
        """One group's membership work, on its worker: detach from lost nodes, build,
        follow the plan, then its jobs (those a re-plan moves in are :meth:`_moves`')."""
        if slot.closed:   # its group ended meanwhile (release_group)
            return []
        outcomes = self._detach_if_lost(slot, allocs) if slot.port is not None else []
        if group.state is GroupState.ACTIVE and slot.port is None:
            slot.port = self._build(group, allocs, now)
            if slot.port is not None:
                self.ports[group.group_id] = slot.port
                self.spans[group.group_id] = slot.port.spans
        port = slot.port
        if port is None:
            return outcomes
        self._follow(port, group, allocs, now)
        outcomes += self._members(port, group, jobs, allocs, store)
        self.rows.refresh(slot.group_id, port, time.monotonic(), force=True)
        return outcomes

    def _moves(self, store: Store, live_groups: Mapping[int, GroupRow],
               rows: Mapping[int, Sequence[AllocRow]], now: float) -> list[JobOutcome]:
        """The moves between groups (module doc of :mod:`~weave_slurm.daemon.handoff`),
        under the locks of every group whose worker lets go of its lock now; a move that
        touches a group busy on its nodes waits for a later tick."""
        outcomes: list[JobOutcome] = []
        slots = self.workers.slots()
        busy = self._rounds.busy()
        held = acquire_all([s for gid, s in slots.items() if gid not in busy],
                           self.config.drive_wait_s)
        try:
            ports = {s.group_id: s.port for s in held if s.port is not None}
            self.moves.groups = ports
            self.moves.busy = set(slots) - {s.group_id for s in held}
            placed = functools.partial(self._placed, live_groups, rows)
            self.moves.hand_off(store, placed, now)
            movers = self.moves.movers(store)   # after hand_off: it may withdraw some
            for job_id, port, member in self.moves.ended(store, movers):   # while moving
                outcomes.append(member_exit.ended(port, self.rows, job_id, member))
            for gid, port in ports.items():
                group = live_groups.get(gid)
                if group is None:
                    continue
                jobs = self.moves.waiting_out(movers, gid, port, placed) + \
                    [j for j in store.jobs(group_id=gid) if _moving(j, gid)]
                outcomes += self._members(port, group, jobs, rows[gid], store)
                self.rows.refresh(gid, port, time.monotonic(), force=True)
        finally:
            self.moves.groups = {}
            for slot in held:
                slot.lock.release()
        return outcomes

    def _members(self, port: GroupPort, group: GroupRow, jobs: Sequence[JobRow],
                 allocs: Sequence[AllocRow], store: Store) -> list[JobOutcome]:
        """Each of ``jobs`` joins, leaves or is reported; a running one's counts stored."""
        outcomes = []
        for job in jobs:
            outcome = self._member_of(port, group, job, allocs, store)
            if outcome is not None:
                outcomes.append(outcome)
            elif job.state is JobState.RUNNING:
                view = port.view(str(job.job_id))
                feedback.count(store, view, job)
                if self.config.plan_from_measurements:
                    feedback.feed_back(store, view, job)
        return outcomes

    def _build(self, group: GroupRow, allocs: Sequence[AllocRow],
               now: float) -> GroupPort | None:
        """The group's runtime, once its node daemons answer (None: it waits)."""
        try:
            refs = {"rollout": [self.node_ref(a, node, Pool.ROLLOUT)
                                for a, node in allocplan.kept_nodes(group.plan, allocs)],
                    "train": [self.node_ref(a, node, Pool.TRAIN)
                              for a, node in pool_nodes(allocs, "train")]}
        except WeaveError as exc:   # a node daemon still starting: the next tick tries again
            self.waits.wait(group, WaitCause.NODE_PORT, str(exc), now)
            return None
        if not refs["train"] or not (refs["rollout"] or group.plan.colocated):
            return None   # a co-located group alone has no rollout node
        layout = GroupLayout(tuple(refs["rollout"]), tuple(refs["train"]))
        if not self._all_answer(group, (*layout.rollout, *layout.train), now):
            return None
        self.waits.done(group)
        port = GroupPort.open(layout, config=self.config.runner, launcher=self.launcher,
                              resolve=self.resolve, observer=self.observer)
        log.info("group %s: runtime attached to %d rollout and %d training node(s)",
                 group.group_id, len(layout.rollout), len(layout.train))
        return port

    def _follow(self, port: GroupPort, group: GroupRow,
                allocs: Sequence[AllocRow], now: float) -> None:
        """The runtime's rollout nodes and its members' pins follow the group's plan
        (module doc): new nodes added, moved members re-pinned, unused nodes retired."""
        target = {self.key(a, n): (a, n) for a, n in allocplan.kept_nodes(group.plan, allocs)}
        have = {n.name for n in port.layout.rollout}
        new = [an for key, an in target.items() if key not in have]
        if new:
            self._extend(port, group, new, now)
        views = port.members
        for m in group.plan.members:
            member = views.get(str(m.job_id))
            pins = self._pins(port, group, m.job_id, allocs)
            if member is None or member.state in _GONE or pins is None \
                    or member.cooperative or member.colocated:   # its nodes are its own
                continue
            pool = pooling.member_pool(group.plan, m.job_id, allocs)
            if tuple(port.layout.rollout[p] for p in pins) != member.next_rollout_nodes \
                    or pool != member.next_pool:   # a pool's width changed too
                port.apply(cmd.Repin(str(m.job_id), pins, pool))
            if member.turns != m.turns:
                port.apply(cmd.SetTurns(str(m.job_id), m.turns))
        keep, used = set(target), port.nodes_in_use()
        idle = [r.name for r in port.layout.rollout if r.name not in keep | used]
        if idle and len(idle) < len(port.layout.rollout):
            port.apply(cmd.Retire(frozenset(idle)))
            log.info("group %s: runtime let go of rollout node(s) %s (no member left on "
                     "them)", group.group_id, ", ".join(idle))

    def _extend(self, port: GroupPort, group: GroupRow,
                nodes: Sequence[tuple[AllocRow, str]], now: float) -> None:
        """Add the nodes of newly held allocations once their daemons answer (meanwhile
        the jobs waiting for them say why)."""
        waiting = [j for j in group.plan.job_ids if str(j) not in port.members]
        try:
            refs = [self.node_ref(a, node, Pool.ROLLOUT) for a, node in nodes]
        except WeaveError as exc:   # a node daemon still starting: the next tick tries again
            self.waits.wait(group, WaitCause.NODE_PORT, str(exc), now, waiting)
            return
        if not self._all_answer(group, refs, now, waiting):
            return
        port.apply(cmd.Extend(tuple(refs)))
        self.waits.done(group)
        log.info("group %s: runtime extended to rollout node(s) %s", group.group_id,
                 ", ".join(r.name for r in refs))

    def _placed(self, groups: Mapping[int, GroupRow], allocs: Mapping[int, Sequence[AllocRow]],
                job: JobRow) -> bool:
        """Whether the moving job's pinned nodes are in its new group's runtime."""
        gid = job.group_id or 0
        group, port = groups.get(gid), self.ports.get(gid)
        return group is not None and port is not None and \
            self._pins(port, group, job.job_id, allocs[gid]) is not None

    def _pins(self, port: GroupPort, group: GroupRow, job_id: int,
              allocs: Sequence[AllocRow]) -> tuple[int, ...] | None:
        """Where the plan's pins of ``job_id`` are in the runtime's layout (None: one of
        its nodes is not held, or not in the runtime yet); () for a member of a
        co-located group (it rolls out on its training node)."""
        nodes = allocplan.member_nodes(group.plan, job_id, allocs)
        index = {n.name: i for i, n in enumerate(port.layout.rollout)}
        keys = [self.key(a, node) for a, node in nodes or ()]
        if nodes is None or (not nodes and not group.plan.colocated) \
                or any(key not in index for key in keys):
            return None
        return tuple(index[key] for key in keys)

    def in_use(self, group_id: int) -> frozenset[str]:
        """The nodes (by name) the group's runtime drives (none while it has no runtime);
        read without waiting on the group (its layout is a frozen value, swapped whole)."""
        port = self.ports.get(group_id)
        if port is None:
            return frozenset()
        layout = port.layout
        return frozenset(n.name for n in (*layout.rollout, *layout.train))

    def leave(self, alloc: AllocRow, nodes: Sequence[str]) -> None:
        """Tell the node daemons of ``alloc`` on ``nodes`` to end: weaved gives the nodes
        back to Slurm next (node/leaving.py); one not told is ended by Slurm."""
        refs = [self.node_ref(alloc, node, Pool.ROLLOUT) for node in nodes]
        for ref, exc in tell_to_leave(refs, self.config.ping_timeout_s,
                                      self.config.runner.munge_socket):
            log.warning("node daemon %s not told to leave (%s): Slurm ends it", ref.name, exc)

    def _detach_if_lost(self, slot: GroupSlot,
                        allocs: Sequence[AllocRow]) -> list[JobOutcome]:
        """A node of the group's layout is no longer in a held allocation (it went down):
        stop driving the group without dropping any state; each member goes on as
        ``Detach`` decides once the group is active on a new allocation."""
        gid, port = slot.group_id, slot.port
        assert port is not None
        lost = allocplan.lost_nodes((*port.layout.rollout, *port.layout.train), allocs,
                                    self.key)
        if not lost:
            return []
        log.warning("group %s: lost %s; detaching its runtime until it is active again", gid,
                    ", ".join(f"{r.pool.value} node {r.name}" for r in lost))
        outcomes = []
        events = port.apply(cmd.Detach(tuple(lost), self.config.checkpoint_base))
        views = port.members
        for event in events:
            if not isinstance(event, Detached):
                continue
            job_id, resume, member = int(event.job_id), event.resume, views[event.job_id]
            if resume.kind is ResumeKind.ENDED:   # its port closes below: it leaves now
                outcomes.append(member_exit.ended(port, self.rows, job_id, member))
                member_exit.leave(port, self.rows, member)
                continue
            self.rows.put(job_id, {**member_row(member), "phase": "recover",
                                   "event": resume.why})
            if resume.kind is ResumeKind.FAILED:
                outcomes.append(JobOutcome(job_id, JobState.FAILED, resume.why))
            else:
                self._resume[job_id] = resume
        self._unset(slot)
        port.close()
        return outcomes

    def _all_answer(self, group: GroupRow, refs: Sequence[NodeRef], now: float,
                    jobs: Sequence[int] | None = None) -> bool:
        """Whether every daemon of ``refs`` answers; else the group (its ``jobs``) waits,
        by the first failure's cause (still starting, or refusing us): next tick again."""
        silent = first_silent(refs, self.config.ping_timeout_s,
                              self.config.runner.munge_socket)
        if silent is None:
            return True
        ref, error = silent
        self.waits.wait(group, answer_cause(error), f"the node daemon on {ref.name} "
                        f"does not answer yet: {error}", now, jobs)
        return False

    def _member_of(self, port: GroupPort, group: GroupRow, job: JobRow,
                   allocs: Sequence[AllocRow], store: Store) -> JobOutcome | None:
        key = str(job.job_id)
        member = port.view(key)
        moving = job.moving_from is not None and job.moving_from != group.group_id
        if moving and member is not None and member.state is MemberState.CANCELLED:
            member = None   # it left this group earlier and a re-plan moves it back
        if job.state is JobState.RUNNING:
            if member is None:
                pins = self._pins(port, group, job.job_id, allocs)
                if pins is None:
                    return None   # its rollout nodes join the runtime first (_follow)
                if moving and not self.moves.ready(store, job):
                    return None   # it finishes its step in flight in its old group first
                resume = self._resume.pop(job.job_id, None)
                if resume is not None and resume.kind is ResumeKind.FAILED:
                    return JobOutcome(job.job_id, JobState.FAILED, resume.why)
                try:
                    pool = pooling.member_pool(group.plan, job.job_id, allocs)
                    events = port.apply(cmd.Adopt(member_spec(job, group, pins, pool),
                                                  resume))
                except WeaveError as exc:
                    return JobOutcome(job.job_id, JobState.FAILED, f"cannot join: {exc}")
                self.waits.jobs.pop(job.job_id, None)
                log.info("job %s joined group %s%s", job.job_id, group.group_id,
                         " (re-attached to its warm state)" if any(
                             isinstance(e, MemberChanged) and e.job_id == key
                             and e.state is MemberState.RECOVERING for e in events) else "")
                if moving:
                    self.moves.moved_in(store, job, group.group_id)
                return None
            if member.state in (MemberState.DONE, MemberState.FAILED):
                return member_exit.ended(port, self.rows, job.job_id, member)
        elif job.state in _ENDED and member is not None \
                and member.state is not MemberState.CANCELLED:   # its end is stored:
            member_exit.leave(port, self.rows, member)   # it leaves (member_exit.ended)
        return None

    def release_group(self, group_id: int) -> None:
        """The group drains: leave (drop) its members now, while its node daemons still
        answer; the next ``drive`` would be too late (their steps are ended first). Its
        worker does it; a worker that a node call holds does it once that call returns."""
        slot = self.workers.get(group_id)
        if slot is None:
            return
        done = slot.submit(functools.partial(self._end_slot, slot))
        if wait([done], timeout=self.config.drive_wait_s).not_done:
            log.warning("group %s: its runtime still waits on its nodes; its members "
                        "leave once it is free", group_id)

    def _end_slot(self, slot: GroupSlot) -> list[JobOutcome]:
        """The group ended: its members leave, its runtime closes, its worker ends."""
        if slot.port is not None:
            port = slot.port
            self._unset(slot)
            views = port.members
            for key in port.order:
                member_exit.leave(port, self.rows, views[key])
            port.close()
        self.workers.end(slot)
        return []

    def _unset(self, slot: GroupSlot) -> None:
        """The slot's runtime is no longer driven (it is closed next)."""
        slot.port = None
        self.rows.forget(slot.group_id)
        self.ports.pop(slot.group_id, None)

    # -- the groups' workers ---------------------------------------------------------
    def start(self) -> None:
        """Start each group's worker (and those of groups built later)."""
        self.workers.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop ticking; node daemons and members stay (a restart re-attaches). A port
        is closed once its worker ended (never under a running tick)."""
        for slot in self.workers.stop(timeout_s):
            with slot.lock:
                if slot.port is not None:
                    slot.port.close()

    def _tick(self, slot: GroupSlot) -> bool:
        """One pass of the group's runtime (its worker holds its lock); True if anything
        changed. A member that ended wakes the reconcile loop (it reports the job)."""
        port = slot.port
        assert port is not None
        try:
            tick = port.tick()
        except Exception:
            log.exception("group %s: runtime tick failed; retrying", slot.group_id)
            return False
        if any(isinstance(e, MemberEnded) for e in tick.events):
            self.wake()
        self.rows.refresh(slot.group_id, port, time.monotonic())
        return tick.changed

    # -- the read side ---------------------------------------------------------------
    def live(self, job_id: int) -> dict[str, Any] | None:
        """The runtime's view of a job for status (None: never ran here)."""
        return self.rows.get(job_id)

    def waiting(self, job_id: int) -> str | None:
        """Why the job's group has not started it: its node daemons (None: not waiting)."""
        return self.waits.jobs.get(job_id)


def _moving(job: JobRow, group_id: int) -> bool:
    """Whether a re-plan moves ``job`` into ``group_id`` (from another group)."""
    return job.moving_from is not None and job.moving_from != group_id
