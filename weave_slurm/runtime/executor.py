"""The group executor: drives a group's node daemons through the cyclic round-robin.

One tick (:meth:`GroupExecutor.tick`) first reads the world (each running phase's
state from its node daemon), then acts: finished phases move their output (rollout:
trajectories rollout node -> training node; train: weights training node -> every
rollout node the member is pinned to, then a node checkpoint), failed or hung phases
send their member to recovery, and every free node starts the next ready member in
cyclic order (:func:`~weave_slurm.runtime.ordering.next_member`). The on-policy
barrier holds end to end: a member has at most one phase in flight, its rollout runs
on the weights segment of its latest version, and its training step is handed only
its own ``traj`` segment, which ``JobRunner.train`` refuses unless it is of the
current version. A failure touches only its member: it is re-admitted from the
newest checkpoint on its training node while the others keep running.

With ``ExecutorConfig.migrate_tail`` a rollout reports its progress; once its
remaining requests fall to ``tail_fraction`` of the batch, its node counts as free
for the next ready member's rollout, which starts beside the tail (at most one tail
per node); the tail ends and is delivered as usual (docs/runtime.md).

A member with a staleness window ``k >= 1`` may have its rollout of step ``m`` (on
exactly version ``max(0, m - k)``, from a ring of ``k + 1`` checked weight buffers)
in flight next to its training step; see :mod:`weave_slurm.runtime.staleness`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from weave_slurm.errors import (
    ConfigError,
    NodeUnavailable,
    StateError,
    WeaveError,
)
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime import phases, recovery
from weave_slurm.runtime.group import (
    TRANSITIONS,
    GroupLayout,
    MemberSpec,
    MemberState,
    NodeRef,
    PhaseKind,
    Pool,
)
from weave_slurm.runtime.member import (
    Clock,
    ExecutorConfig,
    Member,
    MonotonicClock,
    PhaseRun,
    TailMove,
)
from weave_slurm.runtime.ordering import (
    next_member,
    phase_deadline_s,
    rollout_version,
)
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.staleness import (
    TRAJ_BUFFER,
    WEIGHTS_BUFFER,
    BatchRecord,
    VersionLog,
    buffer_name,
)
from weave_slurm.runtime.timeline import Span
from weave_slurm.runtime.transfer import make_transfer

__all__ = ["Clock", "ExecutorConfig", "GroupExecutor", "Member", "MonotonicClock", "TailMove"]

log = logging.getLogger(__name__)

_ENTRY = "weave_slurm.runtime.phases:"


class GroupExecutor:
    """Runs the members of one group on its node daemons (see module doc)."""

    def __init__(self, layout: GroupLayout, members: Sequence[MemberSpec], *,
                 clock: Clock | None = None, config: ExecutorConfig | None = None,
                 profiler: LiveProfiler | None = None,
                 client_factory: Callable[[Path], Any] | None = None) -> None:
        layout.validate()
        self.layout = layout
        self.clock = clock or MonotonicClock()
        self.config = config or ExecutorConfig()
        self.profiler = profiler or LiveProfiler()
        self.transfer = make_transfer(self.config.transfer, layout, self.client)
        self.members: dict[str, Member] = {}
        self.order: list[str] = []
        self.spans: list[Span] = []
        self._clients: dict[Path, Any] = {}
        self._client_factory = client_factory
        self._last_served: dict[str, str] = {}
        self._busy: dict[str, str] = {}             # node name -> job id
        self._tails: dict[str, str] = {}            # node name -> job id of its migrated tail
        self.tail_moves: list[TailMove] = []
        self._run_ids = 0
        self._ended: list[tuple[Member, PhaseRun, dict[str, Any], tuple[Any, Any], float]] = []
        self.listeners: list[Callable[[Member, str], None]] = []
        for spec in members:
            self.join(spec)

    # -- node daemons ----------------------------------------------------------------
    def client(self, socket_path: Path) -> Any:
        if socket_path not in self._clients:
            if self._client_factory is not None:
                self._clients[socket_path] = self._client_factory(socket_path)
            else:
                from weave_slurm.node.client import NodeClient

                self._clients[socket_path] = NodeClient(socket_path)
        return self._clients[socket_path]

    def _call(self, node: NodeRef, op: Op, **args: Any) -> dict[str, Any]:
        try:
            return dict(self.client(node.socket_path).call(op, **args))
        except (OSError, StateError) as exc:
            if isinstance(exc, StateError) and "closed the connection" not in str(exc) \
                    and "no node daemon" not in str(exc) \
                    and not isinstance(exc.__cause__, OSError):   # broken pipe, reset
                raise
            old = self._clients.pop(node.socket_path, None)   # reconnect next time
            if old is not None:
                old.close()
            raise NodeUnavailable(f"node {node.name}: daemon at {node.socket_path} is "
                                  f"gone: {exc}") from exc

    def close(self) -> None:
        self.transfer.close()
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    # -- membership ------------------------------------------------------------------
    def join(self, spec: MemberSpec) -> Member:
        """Add a member at the end of the cyclic order; its state is put on first use."""
        if spec.job_id in self.members and \
                self.members[spec.job_id].state is not MemberState.CANCELLED:
            raise ConfigError(f"member {spec.job_id!r} is already in the group")
        spec.validate(len(self.layout.rollout), len(self.layout.train))
        member = Member(spec, JobRef(spec.job_id, os.getuid() if spec.uid is None
                                     else spec.uid),
                        self.layout.train[spec.train_node],
                        tuple(self.layout.rollout[p] for p in spec.rollout_pins))
        member.history.append((self.clock.now(), MemberState.STARTING, "joined"))
        records = self.config.records_dir
        member.versions = VersionLog(spec.job_id, spec.staleness, None if records is None
                                     else Path(records) / f"{spec.job_id}.versions.jsonl")
        self.members[spec.job_id] = member
        self.order = [j for j in self.order if j != spec.job_id] + [spec.job_id]
        self.profiler.track(spec.job_id, spec.declared)
        return member

    def leave(self, job_id: str) -> None:
        """Cancel a member: stop its phase, drop its state, workers and checkpoints."""
        member = self._member(job_id)
        for run in list(member.runs.values()):
            self._release(member, run)
        for node in (member.train_node, *member.rollout_nodes):
            try:
                self._call(node, Op.DROP, job=job_id)
            except WeaveError as exc:   # unregistered there, or the node is gone
                log.info("drop of %s on %s: %s", job_id, node.name, exc)
        self.transfer.forget(member.job)
        self._move(member, MemberState.CANCELLED, "left the group")
        self.order.remove(job_id)
        self.profiler.forget(job_id)

    def _member(self, job_id: str) -> Member:
        if job_id not in self.members:
            raise ConfigError(f"no member {job_id!r} in this group "
                              f"(members: {', '.join(self.order) or 'none'})")
        return self.members[job_id]

    def _move(self, member: Member, to: MemberState, why: str) -> None:
        if to not in TRANSITIONS[member.state]:
            raise StateError(f"member {member.spec.job_id}: {member.state.value} -> "
                             f"{to.value} is not a valid transition ({why})")
        member.history.append((self.clock.now(), to, why))
        member.state = to
        if to is MemberState.READY:
            member.ready_s = self.clock.now()
        for listener in self.listeners:
            listener(member, why)

    # -- the loop --------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        live = (MemberState.DONE, MemberState.FAILED, MemberState.CANCELLED)
        return all(m.state in live for m in self.members.values())

    def run(self, timeout_s: float | None = None,
            on_tick: Callable[[GroupExecutor], None] | None = None) -> None:
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
                if self.config.migrate_tail and run.run_id is not None \
                        and run.tail_s is None and not run.ended \
                        and member.runs.get(run.kind) is run:
                    changed |= self._watch_tail(member, run)
        for member in list(self.members.values()):
            if member.state is MemberState.RECOVERING:
                changed |= recovery.recover(self, member)
        # start the next members first: a node's next phase need not wait for the
        # previous member's data moves and checkpoint (other jobs, other segments)
        changed |= self._dispatch(self.layout.train, Pool.TRAIN)
        changed |= self._dispatch(self.layout.rollout, Pool.ROLLOUT)
        ended, self._ended = self._ended, []
        for member, run, result, worker_s, end in ended:
            if member.state is MemberState.CANCELLED or member.runs.get(run.kind) is not run:
                continue
            try:
                self._finish(member, run, result, worker_s, end)
            except WeaveError as exc:
                recovery.fail(self, member,
                              f"after {run.kind.value} on {run.node.name}: {exc}",
                              node_fault=isinstance(exc, NodeUnavailable))
        if ended:
            self._dispatch(self.layout.train, Pool.TRAIN)
            self._dispatch(self.layout.rollout, Pool.ROLLOUT)
        return changed

    # -- dispatch --------------------------------------------------------------------
    def _ready_on(self, node: NodeRef, pool: Pool) -> set[str]:
        ready = set()
        for job_id, m in self.members.items():
            kind = m.wants()
            if pool is Pool.TRAIN and kind is PhaseKind.TRAIN and m.train_node == node:
                ready.add(job_id)
            if pool is Pool.ROLLOUT and kind is PhaseKind.ROLLOUT and node in m.rollout_nodes:
                ready.add(job_id)
        return ready

    def _dispatch(self, nodes: Sequence[NodeRef], pool: Pool) -> bool:
        started = False
        for node in nodes:
            if node.name in self._busy:
                continue
            job_id = next_member(self.order, self._last_served.get(node.name),
                                 self._ready_on(node, pool))
            if job_id is None:
                continue
            self._last_served[node.name] = job_id
            member = self.members[job_id]
            try:
                self._start(member, node)
                started = True
            except WeaveError as exc:
                recovery.fail(self, member,
                              f"start of {member.next_kind.value} on {node.name}: {exc}",
                              node_fault=isinstance(exc, NodeUnavailable))
        return started

    def _start(self, member: Member, node: NodeRef) -> None:
        init = not member.initialised
        if init:
            self._register(member)
        kind = PhaseKind.TRAIN if node.pool is Pool.TRAIN else PhaseKind.ROLLOUT
        deadline = phase_deadline_s(
            member.spec.declared.rollout_s if kind is PhaseKind.ROLLOUT
            else member.spec.declared.train_s,
            self.profiler.durations(member.spec.job_id, kind),
            self.config.deadline_factor, self.config.deadline_floor_s)
        fn = "init_train" if init else kind.value
        step = member.rolled if kind is PhaseKind.ROLLOUT else member.version
        args = phases.PhaseArgs.for_phase(member.spec, kind, step)
        run_id = None
        if kind is PhaseKind.ROLLOUT and self.config.migrate_tail:
            self._run_ids += 1
            run_id = f"{member.spec.job_id}.{step}.{self._run_ids}"
            args = dataclasses.replace(args, progress=run_id,
                                       tail_fraction=self.config.tail_fraction)
        self._call(node, Op.ACTIVATE, job=member.spec.job_id, phase=kind.value,
                   entry=_ENTRY + fn, args=[args.encode()])
        now = self.clock.now()
        member.runs[kind] = PhaseRun(kind, node, now, now + deadline, init, member.ready_s,
                                     step, run_id=run_id)
        self._busy[node.name] = member.spec.job_id
        if kind is PhaseKind.ROLLOUT and member.versions is not None:
            member.versions.produced(step, rollout_version(step, member.staleness),
                                     member.version)
        where = f"{kind.value} v{member.version} on {node.name}"
        if member.state is MemberState.READY or (member.state is MemberState.ROLLOUT
                                                 and kind is PhaseKind.TRAIN):
            self._move(member, MemberState.ROLLOUT if kind is PhaseKind.ROLLOUT
                       else MemberState.TRAIN, where)

    def _register(self, member: Member) -> None:
        for node in (member.train_node, *member.rollout_nodes):
            owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
            self._call(node, Op.REGISTER, job=member.spec.job_id, checkpoint_interval_s=0,
                       **owner)

    # -- completion ------------------------------------------------------------------
    def _poll(self, member: Member, run: PhaseRun) -> bool:
        try:
            worker = self._call(run.node, Op.PHASE, job=member.spec.job_id).get("worker") or {}
        except WeaveError as exc:
            recovery.fail(self, member, str(exc),
                          node_fault=isinstance(exc, NodeUnavailable))
            return True
        state = worker.get("state")
        if state == "running":
            if self.clock.now() > run.deadline_s:
                recovery.fail(self, member, f"{run.kind.value} on {run.node.name} hung: ran "
                              f"past its deadline of {run.deadline_s - run.start_s:.1f} s")
                return True
            return False
        if state != "exited":
            why = worker.get("error") or f"returncode {worker.get('returncode')}"
            recovery.fail(self, member, f"{run.kind.value} on {run.node.name} {state}: {why}")
            return True
        run.ended = True         # the node is free; the member's output is not moved yet
        self._free(member, run)
        self._ended.append((member, run, dict(worker.get("result") or {}),
                            (worker.get("t_recv"), worker.get("t_done")), self.clock.now()))
        return True

    def _watch_tail(self, member: Member, run: PhaseRun) -> bool:
        """Read a rollout's progress; in its tail, free its node for the next member."""
        now = self.clock.now()
        node = run.node.name
        if now < run.progress_at_s + self.config.progress_poll_s or node in self._tails:
            return False          # at most one migrated tail per node
        run.progress_at_s = now
        try:
            info = self._call(run.node, Op.ATTACH_INFO, job=member.spec.job_id)
        except WeaveError as exc:     # the PHASE poll decides about a lost node
            log.info("progress of %s on %s: %s", member.spec.job_id, node, exc)
            return False
        seg = dict(dict(info.get("segments") or {}).get(phases.PROGRESS) or {})
        extra = dict(dict(seg.get("index") or {}).get("extra") or {})
        if extra.get("run") != run.run_id or not extra.get("tail"):
            return False
        run.tail_s = now
        self._tails[node] = member.spec.job_id
        if self._busy.get(node) == member.spec.job_id:
            self._busy.pop(node)
        move = TailMove(member.spec.job_id, node, run.step, now, int(extra["remaining"]),
                        int(extra["total"]))
        self.tail_moves.append(move)
        log.info("rollout %d of %s on %s: tail (%d of %d requests left); node freed",
                 run.step, member.spec.job_id, node, move.remaining, move.total)
        return True

    def _free(self, member: Member, run: PhaseRun) -> None:
        """The node ``run`` held is free (its bulk or its migrated tail, whichever it is)."""
        job_id = member.spec.job_id
        if self._busy.get(run.node.name) == job_id:
            self._busy.pop(run.node.name, None)
        if self._tails.get(run.node.name) == job_id:
            self._tails.pop(run.node.name, None)

    def _finish(self, member: Member, run: PhaseRun, result: Mapping[str, Any],
                worker_s: tuple[Any, Any], end: float) -> None:
        job_id = member.spec.job_id
        member.runs.pop(run.kind, None)
        for write in member.deferred.pop(run.node.name, []):
            write()
        w0, w1 = (None if t is None else float(t) for t in worker_s)
        self.spans.append(Span(job_id, run.kind, run.node.name, run.node.pool,
                               run.start_s, end, True, run.ready_s, w0, w1))
        if not run.init:
            self.profiler.phase(job_id, run.kind, end - run.start_s)
        if run.kind is PhaseKind.ROLLOUT:
            self._finish_rollout(member, run)
        else:
            self._finish_train(member, run, result)

    def _finish_rollout(self, member: Member, run: PhaseRun) -> None:
        k = member.staleness
        name = phases.TRAJ if k == 0 else buffer_name(TRAJ_BUFFER, run.step, k)
        member.rolled = run.step + 1

        def deliver() -> None:
            self._sync(member, name, run.node, [member.train_node], "trajectories")
            member.delivered = run.step + 1
        self._write(member, member.train_node, deliver)
        member.next_kind = PhaseKind.TRAIN
        if PhaseKind.TRAIN not in member.runs:
            self._move(member, MemberState.READY, f"rollout {run.step} done")

    def _finish_train(self, member: Member, run: PhaseRun, result: Mapping[str, Any]) -> None:
        job_id = member.spec.job_id
        member.version = int(result["version"])
        self.profiler.state_bytes(job_id, train=int(result.get("state_bytes", 0)),
                                  rollout=int(result.get("weights_bytes", 0)))
        if not run.init and member.versions is not None:
            member.versions.consumed(run.step, run.step)
        self._sync_weights(member)
        if run.init or member.version % member.spec.checkpoint_every == 0 \
                or member.version >= member.spec.steps:
            self._call(member.train_node, Op.CHECKPOINT, job=job_id)
        if run.init:
            member.initialised = True
        else:
            member.rewards.append(float(dict(result.get("metrics", {})).get("reward_mean",
                                                                            float("nan"))))
            self.profiler.iteration_end(job_id, self.clock.now())
        member.next_kind = PhaseKind.ROLLOUT
        if PhaseKind.ROLLOUT in member.runs:
            self._move(member, MemberState.ROLLOUT, f"train -> v{member.version}, "
                       f"rollout {member.runs[PhaseKind.ROLLOUT].step} still running")
        elif member.version >= member.spec.steps:
            self._move(member, MemberState.READY, "final step")
            self._move(member, MemberState.DONE, f"reached version {member.version}")
        elif member.state is MemberState.STARTING:
            self._move(member, MemberState.READY, "warm state on its nodes")
        else:
            self._move(member, MemberState.READY, f"train -> v{member.version}")

    def _sync_weights(self, member: Member) -> None:
        """The train node's ``weights`` to the rollout nodes (k >= 1: into a checked buffer).

        A stale member also keeps the ring on its training node, so a checkpoint holds
        the last ``k + 1`` versions its replayed rollouts need after a restore.
        """
        k = member.staleness
        if k == 0:
            self._sync(member, phases.WEIGHTS, member.train_node, member.rollout_nodes,
                       "weights")
            return
        buf = buffer_name(WEIGHTS_BUFFER, member.version, k)
        for node in (member.train_node, *member.rollout_nodes):
            self._write(member, node, lambda node=node: self._sync(  # type: ignore[misc]
                member, phases.WEIGHTS, member.train_node, [node], "weights", buf))

    def _write(self, member: Member, node: NodeRef, write: Callable[[], None]) -> None:
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

    def _sync(self, member: Member, name: str, src: NodeRef, dsts: Sequence[NodeRef],
              what: str, as_name: str | None = None) -> None:
        """Copy a segment to ``dsts`` (``as_name``: into that checked buffer there)."""
        start = self.clock.now()
        _, moved = self.transfer.copy(src, dsts, member.job, name, as_name)
        end = self.clock.now()
        self.profiler.sync(member.spec.job_id, what, moved)
        self.profiler.phase(member.spec.job_id, PhaseKind.SYNC, end - start)
        self.spans.append(Span(member.spec.job_id, PhaseKind.SYNC, src.name, src.pool,
                               start, end))

    def _release(self, member: Member, run: PhaseRun) -> None:
        member.runs.pop(run.kind, None)
        self._free(member, run)

    # -- read API (daemon status, demo) ----------------------------------------------
    def status(self) -> list[dict[str, object]]:
        """One row per member (:meth:`Member.status_row`: state, version, phase, node,
        reward, recoveries, error, the window ``staleness`` and ``current_staleness``,
        ``tail``: its rollout is a migrated tail)."""
        return [self.members[j].status_row() for j in
                [*self.order, *(j for j in self.members if j not in self.order)]]

    def version_log(self, job_id: str) -> list[BatchRecord]:
        """The member's trajectory-version log: one record per batch, in step order."""
        log_ = self._member(job_id).versions
        return [] if log_ is None else list(log_.records)
