"""A member's training gang on its training nodes: its ranks, its world, its phases.

A member's layout (:class:`~weave_slurm.model.layout.MemberLayout`) puts ``N``
training ranks on its training nodes, one per GPU. Each rank is a node-level job of
its own on its node (:func:`~weave_slurm.hosted.contract.rank_job`: rank 0 is the job
itself): registered with the job's uid, its own resident worker forked by that node's
daemon, its own ``state`` shard and its own checkpoints. A single rank is a gang of
one, so every member goes through the same code.

- **The world.** The runtime chooses where it meets: ``tcp://<rank 0's node>:<port>``,
  the port from the site's range (:class:`GangPorts`), not one another live world of
  this runner holds on that node. Every rank's phase carries it; the workers join on
  their first phase and keep the world while they live (:mod:`weave_slurm.hosted.world`).
- **A phase** starts on every rank at once (:meth:`Gang.activate`), only when all of
  the gang's nodes are free, and ends when all ranks have ended
  (:func:`read_phase`); the first rank that failed, was killed or cannot be reached
  fails the whole gang, as a fault naming that rank's node.
- **A failed gang** is stopped on every node (:meth:`Gang.stop`: its workers and
  their world are gone, checkpoints kept) and formed again on its next phase, with a
  new rendezvous, from the per-rank checkpoints.
- **Checkpoints** are per rank; rank 0's is written last (:meth:`Gang.checkpoint`),
  so rank 0's newest checkpoint is the gang's manifest: a version counts as
  committed only when rank 0 has one of it, and a restore
  (:meth:`Gang.restore_ranks`) takes every other rank's checkpoint of exactly that
  version.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.hosted.contract import PhaseArgs, engine_job, rank_job
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op, WorkerState
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import MemberSpec, NodeRef
from weave_slurm.runtime.nodes import NodeLink
from weave_slurm.vocab import Phase

#: The site's default range of rendezvous ports for training gangs (torchrun's own
#: default, 29500, is inside: a site that runs torchrun jobs beside weave moves it).
DEFAULT_GANG_PORTS = (29400, 29999)


@dataclass(frozen=True)
class RankSlot:
    """One rank of a gang: its place in the world and the node-level job it runs as."""

    rank: int
    local_rank: int
    node: NodeRef
    job: JobRef


@dataclass(frozen=True)
class GangPorts:
    """Rendezvous ports for training gangs: ``[first, last]`` (the site's range)."""

    first: int = DEFAULT_GANG_PORTS[0]
    last: int = DEFAULT_GANG_PORTS[1]

    def __post_init__(self) -> None:
        if not 1024 <= self.first <= self.last <= 65535:
            raise ConfigError(f"gang ports {self.first}-{self.last}: need "
                              f"1024 <= first <= last <= 65535")

    def pick(self, job_id: str, formation: int, taken: Iterable[int]) -> int:
        """A port for ``job_id``'s world (its ``formation``-th), not one of ``taken``:
        spread by the job id so that two runners rarely start at the same port."""
        span = self.last - self.first + 1
        used = set(taken)
        start = zlib.crc32(job_id.encode()) + formation
        for i in range(span):
            port = self.first + (start + i) % span
            if port not in used:
                return port
        raise WeaveError(f"no free gang rendezvous port in {self.first}-{self.last} "
                         f"({len(used)} in use on that node)")


@dataclass
class Gang:
    """The training gang of one member (see module doc)."""

    slots: tuple[RankSlot, ...]
    collective: bool = True           # one world (training); False: engines that never talk
    world: str | None = None          # the rendezvous of the live world (None: none)
    port: int | None = None
    formations: int = 0               # worlds formed so far

    @classmethod
    def of(cls, spec: MemberSpec, job: JobRef, train: Sequence[NodeRef],
           whole: bool = True) -> Gang:
        """Every rank ``spec``'s layout places (``whole``), or rank 0 alone."""
        if not whole or spec.layout is None:   # no layout: one rank, one engine
            return cls((RankSlot(0, 0, train[spec.train_node], job),))
        slots = [RankSlot(rank, local, train[node], JobRef(rank_job(job.job_id, rank), job.uid))
                 for node, ranks in spec.placed_ranks()
                 for local, rank in enumerate(ranks)]
        return cls(tuple(slots))

    @classmethod
    def engines_of(cls, spec: MemberSpec, job: JobRef, rollout: Sequence[NodeRef]) -> Gang:
        """The rollout engines ``spec``'s layout (a pooled member: its pool) places on
        its pins (``rollout``: the group's rollout nodes), engine ``e`` the node-level
        job ``engine_job(job, e)``."""
        if spec.rollout_layout is None:    # one engine, on whichever pin is free
            return cls((RankSlot(0, 0, rollout[spec.rollout_pins[0]], job),), collective=False)
        slots = [RankSlot(engine, local, rollout[pin],
                          JobRef(engine_job(job.job_id, engine), job.uid))
                 for pin, engines in spec.placed_engines()
                 for local, engine in enumerate(engines)]
        return cls(tuple(slots), collective=False)

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def lead(self) -> RankSlot:
        return self.slots[0]

    @property
    def others(self) -> tuple[RankSlot, ...]:
        """Ranks 1.. (their own node-level jobs)."""
        return self.slots[1:]

    def weight_senders(self) -> tuple[tuple[NodeRef, JobRef], ...]:
        """Each training node but rank 0's, with its first rank (which holds the full
        ``weights`` there in a sharded sync: ``PhaseArgs.shard_sync``)."""
        if not self.collective:
            return ()
        first: dict[str, RankSlot] = {}
        for slot in self.slots:
            first.setdefault(slot.node.name, slot)
        return tuple((s.node, s.job) for s in first.values() if s.rank != 0)

    def nodes(self) -> tuple[NodeRef, ...]:
        """The gang's training nodes, rank 0's first."""
        out: list[NodeRef] = []
        for slot in self.slots:
            if slot.node not in out:
                out.append(slot.node)
        return tuple(out)

    # -- a phase on every rank -----------------------------------------------------------
    def activate(self, link: NodeLink, ports: GangPorts, taken: Iterable[int], fn: str,
                 args: PhaseArgs, code: Mapping[str, Any], phase: Phase,
                 shard_sync: bool = False) -> None:
        """Start ``fn`` on every rank (a new world first when none is live);
        ``shard_sync``: its weights go out from each of its nodes (see weight_senders)."""
        if self.size > 1 and self.collective and self.world is None:
            self.port = ports.pick(self.lead.job.job_id, self.formations, taken)
            self.formations += 1
            self.world = f"tcp://{self.lead.node.address or '127.0.0.1'}:{self.port}"
        sharded = shard_sync and bool(self.weight_senders())
        # the member's GPUs on each node: its ranks there (a rollout: x GPUs per engine)
        per_node = Counter(slot.node.name for slot in self.slots)
        each = args.engine_gpus if phase is Phase.ROLLOUT else 1
        try:
            for slot in self.slots:
                gpus = per_node[slot.node.name] * each
                ranked = dataclasses.replace(args, gpus=gpus) if self.size == 1 else \
                    dataclasses.replace(
                        args, rank=slot.rank, local_rank=slot.local_rank, world_size=self.size,
                        init_method=self.world, job_id=self.lead.job.job_id,
                        shard_sync=sharded, gpus=gpus)
                link.call(slot.node, Op.ACTIVATE, job=slot.job.job_id, phase=phase.value,
                          entry=fn, args=[ranked.encode()], tenant=self.lead.job.job_id,
                          **code)
        except WeaveError:
            if self.size > 1:      # the started ranks would wait for the others (a call
                self.stop(link)    # that failed may have started its rank too): all stop
            raise

    def deactivate(self, link: NodeLink) -> None:
        """Stop the phase on every rank (best effort: a lost node is no obstacle)."""
        for slot in self.slots:
            link.best_effort(slot.node, Op.DEACTIVATE, job=slot.job.job_id)

    def stop(self, link: NodeLink) -> None:
        """A gang of several ranks that failed: every rank's worker stopped and its shm
        state dropped (checkpoints kept); its world is gone, the next phase forms a new
        one. A single rank keeps its worker (no world to lose)."""
        if self.size == 1 or not self.collective:
            return
        for slot in self.slots:
            link.best_effort(slot.node, Op.DROP, job=slot.job.job_id, keep_checkpoints=True)
        self.world = self.port = None

    # -- registration, checkpoints, restore ---------------------------------------------
    def register(self, link: NodeLink, owner: Mapping[str, int]) -> None:
        """Ranks 1.. on their nodes (rank 0 is the member's own registration)."""
        for slot in self.others:
            link.call(slot.node, Op.REGISTER, job=slot.job.job_id, checkpoint_interval_s=0,
                      **owner)

    def drop(self, link: NodeLink) -> None:
        """Ranks 1.. gone from their nodes, checkpoints too (the member left)."""
        for slot in self.others:
            link.best_effort(slot.node, Op.DROP, job=slot.job.job_id)
        self.world = self.port = None

    def checkpoint(self, link: NodeLink) -> None:
        """A checkpoint of every rank, rank 0's last (the gang's manifest)."""
        for slot in (*self.others, self.lead):
            link.call(slot.node, Op.CHECKPOINT, job=slot.job.job_id)

    def restore_ranks(self, link: NodeLink, version: int) -> None:
        """Ranks 1.. from their checkpoints of ``version`` (the one rank 0 committed)."""
        for slot in self.others:
            link.call(slot.node, Op.RESTORE, job=slot.job.job_id, version=version)


def read_phase(link: NodeLink, slots: Sequence[RankSlot], kind: Phase
           ) -> tuple[WorkerState | None, dict[str, Any], Fault | None]:
    """Every rank's phase: RUNNING while any runs; EXITED (rank 0's worker) when all
    have; else a failed rank's fault (typed, naming its node): a rank that could not
    be read or was killed before one that failed (the others' collectives fail
    because of it)."""
    lead: dict[str, Any] = {}
    running = False
    faults: list[tuple[int, WorkerState | None, dict[str, Any], Fault]] = []
    for slot in slots:
        try:
            worker = link.call(slot.node, Op.PHASE, job=slot.job.job_id).get("worker") or {}
        except WeaveError as exc:
            faults.append((0, None, {}, Fault.from_error(exc, slot.node.name, kind)))
            continue
        state = worker_state(worker)
        if state is None:   # e.g. a restarted node daemon: the phase is gone with it
            faults.append((0, None, {}, Fault(
                FaultKind.WORKER_KILLED, slot.node.name, kind,
                evidence=f"the node daemon reports no such phase{_of(slot, len(slots))} "
                         f"(state {worker.get('state')!r})")))
        elif state is WorkerState.RUNNING:
            running = True
        elif state is not WorkerState.EXITED:
            fault = worker_fault(state, worker, slot.node.name, kind)
            faults.append((_RANKED.get(fault.kind, 3), state, worker, fault))
        if slot.rank == 0:
            lead = worker
    if faults:
        _, state, worker, fault = min(faults, key=lambda f: f[0])
        return state, worker, fault
    return (WorkerState.RUNNING if running else WorkerState.EXITED), lead, None


#: Which rank's fault names a gang's failure: one that could not be read (0), was killed
#: (1) or exited (2) comes before one whose phase failed, e.g. in a collective with it.
_RANKED = {FaultKind.WORKER_KILLED: 1, FaultKind.WORKER_EXITED: 2}


def _of(slot: RankSlot, size: int) -> str:
    return "" if size == 1 else f" of rank {slot.rank} of {size}"


def worker_fault(state: WorkerState, worker: Mapping[str, Any], node: str,
                 kind: Phase) -> Fault:
    """A phase whose worker was killed or failed, as a fault (by what the daemon saw)."""
    rc, error = worker.get("returncode"), worker.get("error")
    code = None if rc is None else int(rc)
    if error:
        fk = FaultKind.WORKER_KILLED if state is WorkerState.KILLED else FaultKind.PHASE_FAILED
        return Fault(fk, node, kind, code, str(error))
    killed = state is WorkerState.KILLED and (code is None or code < 0)
    fk = FaultKind.WORKER_KILLED if killed or (code is not None and code < 0) \
        else FaultKind.WORKER_EXITED
    return Fault(fk, node, kind, code)


def worker_state(worker: Mapping[str, Any]) -> WorkerState | None:
    try:
        return WorkerState(str(worker.get("state")))
    except ValueError:
        return None
