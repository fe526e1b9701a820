"""The group runner: drives one group's node daemons through the cyclic round-robin.

One tick (:meth:`GroupRunner.tick`) first reads the world (each running phase's
state from its node daemon), then acts: finished phases move their output (rollout:
trajectories rollout node -> training node; train: weights training node -> every
rollout node the member is pinned to, then a node checkpoint), failed or hung phases
send their member to recovery (:mod:`~weave_slurm.runtime.recovery`; every change of
a member's state goes through its owner, :mod:`~weave_slurm.runtime.lifecycle`), and
every free node starts the next ready member in cyclic order of the members' turns
(:func:`~weave_slurm.runtime.ordering.next_slot`; when members take turns, training
nodes keep to that order). The on-policy
barrier holds end to end: a member has at most one phase in flight, its rollout runs
on the weights segment of its latest version, and its training step is handed only
its own ``traj`` segment, which ``JobRunner.train`` refuses unless it is of the
current version. A failure touches only its member: it is re-admitted from the
newest checkpoint on its training node while the others keep running. Faults are
typed values (:mod:`~weave_slurm.runtime.faults`).

With ``RunnerConfig.long_tail_migration`` a rollout reports its progress; once its
remaining requests fall to ``tail_fraction`` of the batch, its node counts as free
for the next ready member's rollout, which starts beside the tail (at most one tail
per node); the tail ends and is delivered as usual (docs/runtime.md).

A member with a staleness window ``k >= 1`` may have its rollout of step ``m`` (on
exactly version ``max(0, m - k)``, from a ring of ``k + 1`` checked weight buffers)
in flight next to its training step; see :mod:`weave_slurm.runtime.staleness`.

The group's rollout nodes change while it runs: :meth:`GroupRunner.extend` adds the
nodes of an allocation newly held for it (rollout scaling), :meth:`GroupRunner.retire`
drops nodes no member is on any more (the group shrank), and a re-pin
(:meth:`Relayout.repin <weave_slurm.runtime.relayout.Relayout.repin>`) moves a member
to other nodes at its next phase boundary. weaved asks for each through the group's
port (:mod:`~weave_slurm.runtime.port`), which is also where members join and leave.
The runner grows in place rather than being detached and rebuilt: a rebuild re-admits
every member from its node checkpoint (its phase in flight dropped, its training state
reloaded, one recovery counted each), a cost every member of a group would pay for
every arrival that scales it, and a departure that shrinks it; in place, the members
already there never stop, and only what the new layout invalidates is redone (the sync
agents form one world per layout: they are stopped and start over the new one on the
next copy).
"""


from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from weave_slurm.clock import Clock, MonotonicClock
from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.hosted import contract
from weave_slurm.hosted.contract import TRAJ_BUFFER, WEIGHTS_BUFFER, buffer_name, rollout_version
from weave_slurm.node.protocol import Op, WorkerState
from weave_slurm.runtime.agents import Launcher
from weave_slurm.runtime.cooperative import Cooperative
from weave_slurm.runtime.copies import Mover, make_transfer
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.gang import Gang, read_phase
from weave_slurm.runtime.group import GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.lifecycle import Lifecycle
from weave_slurm.runtime.member import NodeSlots, PhaseRun, RunnerConfig, RunningMember, TailMove
from weave_slurm.runtime.nodes import NodeLink, Resolver
from weave_slurm.runtime.ordering import next_slot, phase_deadline_s
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.recovery import Recovery
from weave_slurm.runtime.relayout import Relayout
from weave_slurm.runtime.staleness import BatchRecord
from weave_slurm.runtime.timeline import NoObserver, Span, TimelineObserver
from weave_slurm.runtime.transfer import WeightTransfer
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer
from weave_slurm.vocab import Phase, Pool

__all__ = ["GroupRunner", "RunnerConfig", "RunningMember", "TailMove"]

log = logging.getLogger(__name__)

_Ended = tuple[RunningMember, PhaseRun, dict[str, Any], tuple[Any, Any], float]


class GroupRunner:
    """Runs the members of one group on its node daemons (see module doc)."""

    def __init__(self, layout: GroupLayout, members: Sequence[MemberSpec], *,
                 clock: Clock | None = None, config: RunnerConfig | None = None,
                 profiler: LiveProfiler | None = None,
                 client_factory: Callable[[Path], Any] | None = None,
                 launcher: Launcher | None = None, resolve: Resolver | None = None,
                 observer: TimelineObserver | None = None) -> None:
        layout.validate()
        self.layout = layout
        self.clock = clock or MonotonicClock()
        self.config = config or RunnerConfig()
        self.profiler = profiler or LiveProfiler()
        self.link = NodeLink(client_factory, self.config.munge_socket, resolve)
        self.spans: list[Span] = []
        self.observer = observer or NoObserver()   # told each phase and copy (metrics)
        self.slots = NodeSlots()
        self.lifecycle = Lifecycle(layout, link=self.link,
                                   mover=Mover(make_transfer(self.config.transfer, layout,
                                                             self.link.local, self.link.call,
                                                             launcher),
                                               self.profiler, self.spans, self.clock,
                                               self.observer),
                                   slots=self.slots, profiler=self.profiler,
                                   clock=self.clock, config=self.config)
        self.recovery = Recovery(self.lifecycle, self.spans)
        self.relayout = Relayout(self.lifecycle, self.recovery)
        # members with their own processes
        self.coop = Cooperative(self.lifecycle, self.recovery, self.clock)
        self.tail_moves: list[TailMove] = []
        # (pool, node) -> the place in the turns it served last (a co-located member's
        # training node serves both pools)
        self._last_served: dict[tuple[Pool, str], int] = {}
        self._run_ids = 0
        self._ended: list[_Ended] = []
        for spec in members:
            self.lifecycle.join(spec)

    @property
    def members(self) -> dict[str, RunningMember]:
        """The members, by job id (read them; changes go through the lifecycle)."""
        return self.lifecycle.members

    @property
    def transfer(self) -> WeightTransfer:
        """How the group's segments move between its nodes (one, shared with recovery)."""
        return self.lifecycle.mover.transfer

    @transfer.setter
    def transfer(self, transfer: WeightTransfer) -> None:
        self.lifecycle.mover.transfer = transfer

    def client(self, node: NodeRef) -> Any:
        """The control connection to one of the group's node daemons."""
        return self.link.client(node)

    def close(self) -> None:
        self.transfer.close()
        self.link.close()

    # -- the group's rollout nodes change (see module doc) ---------------------------
    def extend(self, rollout: Sequence[NodeRef]) -> None:
        """Add rollout nodes (an allocation newly held for the group; the caller has
        seen their node daemons answer). Members keep running on their nodes."""
        have = {n.name for n in self.layout.rollout}
        bad = [n.name for n in rollout if n.pool is not Pool.ROLLOUT or n.name in have]
        if bad or not rollout:
            raise ConfigError(f"extend: {', '.join(bad) or 'no node'}: add rollout nodes "
                              f"the group does not have (it has {', '.join(sorted(have))})")
        self._relayout(GroupLayout((*self.layout.rollout, *rollout), self.layout.train))

    def retire(self, names: Collection[str]) -> None:
        """Drop rollout nodes no member is on, moving to or runs a phase on any more."""
        busy = sorted(set(names) & self.nodes_in_use())
        if busy:
            raise StateError(f"retire: rollout node(s) {', '.join(busy)} still serve a member")
        self._relayout(GroupLayout(tuple(n for n in self.layout.rollout if n.name not in names),
                                   self.layout.train))
        for name in names:
            self._last_served.pop((Pool.ROLLOUT, name), None)

    def nodes_in_use(self) -> set[str]:
        """Names of the nodes some member is on, moving to or runs a phase on."""
        return self.lifecycle.nodes_in_use() | set(self.slots.busy) | set(self.slots.tails)

    def _relayout(self, layout: GroupLayout) -> None:
        self.relayout.change(layout)
        self.layout = layout
        if isinstance(self.transfer, TwoTierTransfer):   # agents: one world per layout
            self.transfer.relayout(layout)

    # -- the loop --------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.lifecycle.finished

    def run(self, timeout_s: float | None = None,
            on_tick: Callable[[GroupRunner], None] | None = None) -> None:
        """Tick until every member is done, failed or cancelled."""
        end = None if timeout_s is None else self.clock.now() + timeout_s
        while not self.finished:
            if end is not None and self.clock.now() > end:
                raise StateError(f"group did not finish in {timeout_s} s: "
                                 + ", ".join(f"{m.spec.job_id}={m.state.value}"
                                             for m in self.members.values()))
            if not self.tick():
                self.clock.sleep(self.config.poll_s)
            if on_tick is not None:
                on_tick(self)

    def tick(self) -> bool:
        """Read the world, then act; True if anything changed."""
        changed = False
        for member in list(self.members.values()):
            for run in list(member.runs.values()):
                if not run.ended and run.kind in member.runs:
                    changed |= self._poll(member, run)
                if self.config.long_tail_migration and run.run_id is not None \
                        and run.tail_s is None and not run.ended \
                        and member.runs.get(run.kind) is run:
                    changed |= self._watch_tail(member, run)
        changed |= self.coop.tick()
        for member in list(self.members.values()):
            if member.state is MemberState.RECOVERING:
                changed |= self.recovery.recover(member)
        changed |= self.relayout.carry()
        # start the next members first: a node's next phase need not wait for the
        # previous member's data moves and checkpoint (other jobs, other segments)
        changed |= self._dispatch(self.layout.train, Pool.TRAIN)
        changed |= self._dispatch(self._rollout_places(), Pool.ROLLOUT)
        ended, self._ended = self._ended, []
        for member, run, result, worker_s, end in ended:
            # a member that failed or left since has released the run
            if member.runs.get(run.kind) is not run:
                continue
            try:
                self._finish(member, run, result, worker_s, end)
            except WeaveError as exc:
                self.recovery.fail(member, Fault.from_error(exc, run.node.name, run.kind,
                                                             "after"))
        if ended:
            self._dispatch(self.layout.train, Pool.TRAIN)
            self._dispatch(self._rollout_places(), Pool.ROLLOUT)
        return changed

    def _rollout_places(self) -> tuple[NodeRef, ...]:
        """Where rollouts run: the rollout nodes, then the training nodes co-located
        members roll out on (one node, one set of GPUs: its busy mark serialises
        every phase there, whatever its pool)."""
        colocated = {m.train_node.name for m in self.members.values() if m.spec.colocated}
        return (*self.layout.rollout, *(n for n in self.layout.train if n.name in colocated))

    # -- dispatch --------------------------------------------------------------------
    def _ready_on(self, node: NodeRef, pool: Pool) -> set[str]:
        ready = set()
        for job_id, m in self.members.items():
            kind = m.wants() if self.coop.ready(m, node) else None
            if pool is Pool.TRAIN and kind is Phase.TRAIN and m.train_node == node \
                    and self._gang_free(m, m.gang):   # a gang starts when all its nodes are free
                ready.add(job_id)
            if pool is Pool.ROLLOUT and kind is Phase.ROLLOUT and node in m.rollout_nodes \
                    and (m.engines is None or (node == m.engines.lead.node
                         and self._gang_free(m, m.engines))):   # every engine at once
                ready.add(job_id)
        return ready

    def _gang_free(self, member: RunningMember, gang: Gang | None) -> bool:
        return gang is None or all(n.name not in self.slots.busy for n in gang.nodes())

    def _ports_taken(self, gang: Gang) -> set[int]:
        """The rendezvous ports other live worlds of this group hold on ``gang``'s lead."""
        return {m.gang.port for m in self.members.values()
                if m.gang is not None and m.gang is not gang and m.gang.port is not None
                and m.gang.lead.node == gang.lead.node}

    def _dispatch(self, nodes: Sequence[NodeRef], pool: Pool) -> bool:
        started = False
        turns = self.lifecycle.turn_order
        cycling = self.lifecycle.cycling() if pool is Pool.TRAIN else None
        for node in nodes:
            if node.name in self.slots.busy:
                continue
            order = turns if cycling is None else \
                tuple(j for j in turns if self.members[j].train_node == node)
            slot = next_slot(order, self._last_served.get((pool, node.name)),
                             self._ready_on(node, pool), cycling)
            if slot is None:
                continue
            self._last_served[(pool, node.name)] = slot
            job_id = order[slot]
            member = self.members[job_id]
            try:
                self._start(member, node, pool)
                started = True
            except WeaveError as exc:
                self.recovery.fail(member, Fault.from_error(exc, node.name,
                                                             member.next_kind, "start of"))
        return started

    def _start(self, member: RunningMember, node: NodeRef, pool: Pool) -> None:
        init = not member.initialised
        if init:
            self.lifecycle.register(member)
        kind = Phase.TRAIN if pool is Pool.TRAIN else Phase.ROLLOUT
        deadline = phase_deadline_s(
            member.spec.declared.rollout_s if kind is Phase.ROLLOUT
            else member.spec.declared.train_s,
            self.profiler.durations(member.spec.job_id, kind),
            self.config.phase_deadline_factor, self.config.phase_deadline_floor_s)
        fn = "init_train" if init else kind.value
        step = member.rolled if kind is Phase.ROLLOUT else member.version
        args = dataclasses.replace(member.spec.phase_args(kind, step),
                                   device_switch=self.config.device_switch)
        run_id = None
        # no tail on a co-located member's training node: what it frees is its training
        if kind is Phase.ROLLOUT and self.config.long_tail_migration and member.engines is None \
                and node.pool is Pool.ROLLOUT:
            self._run_ids += 1
            run_id = f"{member.spec.job_id}.{step}.{self._run_ids}"
            args = dataclasses.replace(args, progress=run_id,
                                       tail_fraction=self.config.tail_fraction)
        gang = member.gang_of(kind, node)
        if kind is Phase.TRAIN:   # it merges the slices its batch was rolled out as
            args = dataclasses.replace(args, engines=member.slices_of(step))
        if self.coop.owns(member):   # a grant: its own process waits at the gate
            self.coop.grant(member, node, kind, step)
        else:                        # every rank of a training gang at once
            gang.activate(self.link, self.config.gang_ports, self._ports_taken(gang),
                          contract.entry(fn), args, member.spec.code(), kind,
                          shard_sync=self.lifecycle.mover.shards)
        now = self.clock.now()
        run = member.runs[kind] = PhaseRun(kind, node, now, now + deadline, init,
                                           member.ready_s, step, run_id=run_id,
                                           nodes=gang.nodes())
        for held in run.held():
            self.slots.busy[held.name] = member.spec.job_id
        if kind is Phase.ROLLOUT and member.versions is not None:
            member.versions.produced(step, rollout_version(step, member.staleness),
                                     member.version)
        where = f"{kind.value} v{member.version} on {node.name}"
        if member.state is MemberState.READY or (member.state is MemberState.ROLLOUT
                                                 and kind is Phase.TRAIN):
            self.lifecycle.move(member, MemberState.ROLLOUT if kind is Phase.ROLLOUT
                                else MemberState.TRAIN, where)

    # -- completion ------------------------------------------------------------------
    def _poll(self, member: RunningMember, run: PhaseRun) -> bool:
        state, worker, fault = read_phase(self.link, member.gang_of(run.kind, run.node).slots,
                                          run.kind)
        if fault is not None:
            self.recovery.fail(member, fault)
            return True
        if state is WorkerState.RUNNING:
            if self.clock.now() > run.deadline_s:
                self.recovery.fail(member, Fault(
                    FaultKind.PHASE_HUNG, run.node.name, run.kind,
                    evidence=f"ran past its deadline of {run.deadline_s - run.start_s:.1f} s"))
                return True
            return False
        run.ended = True         # the node is free; the member's output is not moved yet
        self.slots.free_run(member.spec.job_id, run)
        self._ended.append((member, run, dict(worker.get("result") or {}),
                            (worker.get("t_recv"), worker.get("t_done")), self.clock.now()))
        return True

    def _watch_tail(self, member: RunningMember, run: PhaseRun) -> bool:
        """Read a rollout's progress; in its tail, free its node for the next member."""
        now = self.clock.now()
        node = run.node.name
        if now < run.progress_at_s + self.config.progress_poll_s or node in self.slots.tails:
            return False          # at most one migrated tail per node
        run.progress_at_s = now
        try:
            info = self.link.call(run.node, Op.ATTACH_INFO, job=member.spec.job_id)
        except WeaveError as exc:     # the PHASE poll decides about a lost node
            log.info("progress of %s on %s: %s", member.spec.job_id, node, exc)
            return False
        seg = dict(dict(info.get("segments") or {}).get(contract.PROGRESS) or {})
        extra = dict(dict(seg.get("index") or {}).get("extra") or {})
        if extra.get("run") != run.run_id or not extra.get("tail"):
            return False
        run.tail_s = now
        self.slots.tails[node] = member.spec.job_id
        if self.slots.busy.get(node) == member.spec.job_id:
            self.slots.busy.pop(node)
        move = TailMove(member.spec.job_id, node, run.step, now, int(extra["remaining"]),
                        int(extra["total"]))
        self.tail_moves.append(move)
        log.info("rollout %d of %s on %s: tail (%d of %d requests left); node freed",
                 run.step, member.spec.job_id, node, move.remaining, move.total)
        return True

    def _finish(self, member: RunningMember, run: PhaseRun, result: Mapping[str, Any],
                worker_s: tuple[Any, Any], end: float) -> None:
        job_id = member.spec.job_id
        member.runs.pop(run.kind, None)
        for write in member.deferred.pop(run.node.name, []):
            write()
        w0, w1 = (None if t is None else float(t) for t in worker_s)
        self.spans.append(Span(job_id, run.kind, run.node.name, run.node.pool,
                               run.start_s, end, True, run.ready_s, w0, w1, run.init))
        self.observer.phase_ended(self.spans[-1])
        if not run.init:
            self.profiler.phase(job_id, run.kind, end - run.start_s)
        self.profiler.device(job_id, run.kind, result)     # GPU admission's figures
        if self.coop.owns(member):
            self.coop.finish(member, run, dict(result))
        elif run.kind is Phase.ROLLOUT:
            self._finish_rollout(member, run)
        else:
            self._finish_train(member, run, result)

    def _finish_rollout(self, member: RunningMember, run: PhaseRun) -> None:
        k = member.staleness
        name = contract.TRAJ if k == 0 else buffer_name(TRAJ_BUFFER, run.step, k)
        member.rolled = run.step + 1
        engines = member.gang_of(Phase.ROLLOUT, run.node).slots
        member.rolled_as(run.step, len(engines))

        def deliver() -> None:   # each engine's slice from its node (one: the batch)
            for slot in engines:
                self.lifecycle.mover.copy(member, contract.traj_part(name, slot.rank,
                                                                     len(engines)),
                                          slot.node, [member.train_node], "trajectories")
            member.delivered = run.step + 1
        self._write(member, member.train_node, deliver)
        member.next_kind = Phase.TRAIN
        if Phase.TRAIN not in member.runs:
            self.lifecycle.move(member, MemberState.READY, f"rollout {run.step} done")

    def _finish_train(self, member: RunningMember, run: PhaseRun,
                      result: Mapping[str, Any]) -> None:
        job_id, version = member.spec.job_id, int(result["version"])
        self.profiler.state_bytes(job_id, train=int(result.get("state_bytes", 0)),
                                  rollout=int(result.get("weights_bytes", 0)))
        if not run.init and member.versions is not None:
            member.versions.consumed(run.step, run.step)
        self._sync_weights(member, version)
        if run.init or version % member.spec.checkpoint_every == 0 or version >= member.spec.steps:
            assert member.gang is not None
            member.gang.checkpoint(self.link)     # every rank's, rank 0's last
        member.version = version   # shown now: a failed sync/checkpoint re-admits the one before
        if run.init:
            member.initialised = True
        else:
            member.rewards.append(float(dict(result.get("metrics", {})).get("reward_mean",
                                                                            float("nan"))))
            self.profiler.iteration_end(job_id, self.clock.now())
        member.next_kind = Phase.ROLLOUT
        move = self.lifecycle.move
        if Phase.ROLLOUT in member.runs:
            move(member, MemberState.ROLLOUT, f"train -> v{member.version}, "
                 f"rollout {member.runs[Phase.ROLLOUT].step} still running")
        elif member.version >= member.spec.steps:
            move(member, MemberState.READY, "final step")
            move(member, MemberState.DONE, f"reached version {member.version}")
        elif member.state is MemberState.STARTING:
            move(member, MemberState.READY, "warm state on its nodes")
        else:
            move(member, MemberState.READY, f"train -> v{member.version}")

    def _sync_weights(self, member: RunningMember, version: int) -> None:
        """The train node's ``weights`` to the rollout nodes (k >= 1: into a checked buffer).

        A stale member also keeps the ring on its training node, so a checkpoint holds
        the last ``k + 1`` versions its replayed rollouts need after a restore.
        """
        k, copy = member.staleness, self.lifecycle.mover.copy
        if k == 0:   # a gang over several nodes: sent from each of them (moves.py)
            copy(member, contract.WEIGHTS, member.train_node, member.rollout_nodes, "weights",
                 from_gang=True)
            return
        buf = buffer_name(WEIGHTS_BUFFER, version, k)
        for node in dict.fromkeys((member.train_node, *member.rollout_nodes)):
            self._write(member, node, lambda node=node: copy(  # type: ignore[misc]
                member, contract.WEIGHTS, member.train_node, [node], "weights", buf, True))

    def _write(self, member: RunningMember, node: NodeRef, write: Callable[[], None]) -> None:
        """Put a segment of ``member`` on ``node`` now, or when its phase there ends.

        The resident worker attaches every segment of its job when a phase starts; a
        segment being replaced meanwhile reads as missing there. So a write to a node
        where the member's own phase runs waits for that phase's end (another buffer
        than the one it reads, so the phase never needed it).
        """
        if any(r.node == node and not r.ended for r in member.runs.values()):
            member.deferred.setdefault(node.name, []).append(write)
        else:
            write()

    # -- read API (daemon status, demo) ----------------------------------------------
    def status(self) -> list[dict[str, object]]:
        """One row per member (:meth:`RunningMember.status_row`: state, version, phase, node,
        reward, recoveries, error, the window ``staleness`` and ``current_staleness``,
        ``tail``: its rollout is a migrated tail)."""
        order = self.lifecycle.order
        return [self.members[j].status_row() for j in
                [*order, *(j for j in self.members if j not in order)]]

    def version_log(self, job_id: str) -> list[BatchRecord]:
        """The member's trajectory-version log: one record per batch, in step order."""
        log_ = self.lifecycle.member(job_id).versions
        return [] if log_ is None else list(log_.records)
