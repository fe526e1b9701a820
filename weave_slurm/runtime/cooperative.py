"""Cooperative members: the job's own processes take their phases through the gate.

A member whose spec has a :class:`~weave_slurm.runtime.launch_plan.LaunchPlan` is run
by its own processes (:mod:`weave_slurm.gate`), not by resident workers. For ordering
it is a member like any other; what differs is what a phase *is*:

- **Start.** On its first turn the member is registered on its nodes and its two
  processes are started there by the node daemons, as its owner (``launch``): the
  training role on its training node, the rollout role on its first pinned rollout
  node. It is then READY at version 0 (no ``init_train``: its state is its own).
- **Ready.** Its next phase (the one ``RunningMember.wants`` names, the usual barrier) is
  ready only while its process waits at the gate for that phase at the version it
  must be at: a rollout at the job's current version ``v``, a train at ``v`` once its
  rollout at ``v`` ended. The node daemons report who waits (``phase`` -> ``gate``),
  read at most every :data:`POLL_S`.
- **Refused.** A wait that can never be granted (:func:`judge`: a train at a version
  without the matching rollout, a rollout at a version the job's weights are not at,
  anything past the job's iterations) is refused at once (``gate`` ``refuse``): the
  process gets :class:`~weave_slurm.errors.GateRefused` with the reason in one line;
  the job's REASON says it too (:meth:`Cooperative.refusal`), and a process that then
  exits non-zero fails the member with it (its fault is the refusal, not the exit).
- **Grant.** The runner's ``activate`` is a grant (``external``); the phase runs, for
  the runner's poll and deadline, until the process leaves its ``with`` block. A
  phase past its deadline is hung, as any member's: the runner revokes it.
- **End of a phase.** No data moves: the job syncs its own weights. A rollout at
  ``v`` delivers batch ``v``; a train at ``v`` makes the job's version ``v + 1``. The
  metrics a turn reported (``turn.report``) are kept: a rollout's until its train ends,
  when the iteration's metrics are both turns' (the train's win a key both report), as
  a hosted job's trajectories' metrics join its train's.
- **Faults.** weave holds no state of a cooperative job, so it cannot re-admit one
  from a checkpoint: a member sent to recovery (hung, a process that exited non-zero,
  a node gone) has its processes stopped and is FAILED, with the fault in words.
- **End.** Its work is done when its train process (the driver) has exited 0 after
  its last train (the job's iterations): it is DONE, and its rollout process, if it
  still runs (a ``ray start --block`` serving the driver), is stopped, not waited for.
  Before that, a process that exits non-zero, or exits while it holds its phase, fails
  it; one that exits 0 while the member still needs its phase ends it too (FAILED
  before its iterations). Every stop ends a role's whole process tree (node/reaper.py).
- **Addresses and ports.** Each role is told both nodes' addresses and a port range of
  the member's own (runtime/member_net.py), held until the member ends.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from weave_slurm.clock import Clock
from weave_slurm.errors import VersionMismatch, WeaveError
from weave_slurm.node.protocol import Op, WorkerState
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import MemberState, NodeRef
from weave_slurm.runtime.lifecycle import Lifecycle
from weave_slurm.runtime.member import PhaseRun, RunningMember
from weave_slurm.runtime.member_net import SLOTS, MemberNet, node_addr
from weave_slurm.runtime.recovery import Recovery
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)

#: Least time between two reads of a cooperative member's gate on its nodes.
POLL_S = 0.02
ROLE = {Phase.ROLLOUT: "rollout", Phase.TRAIN: "train"}
PHASE_OF = {role: phase for phase, role in ROLE.items()}
_ENDED = frozenset({MemberState.DONE, MemberState.FAILED, MemberState.CANCELLED,
                    MemberState.MOVED})


class Verdict(enum.Enum):
    READY = "ready"        # grant it when the ordering says so
    WAIT = "wait"          # valid once the job's other phase ended
    REFUSE = "refuse"      # can never be granted: the process is told why


@dataclass(frozen=True)
class Refusal:
    job_id: str
    phase: Phase
    version: int
    message: str
    at_s: float


def judge(phase: Phase, version: int, *, at: int, rolled: int, steps: int,
          running: frozenset[Phase]) -> tuple[Verdict, str]:
    """Whether a wait for ``phase`` at ``version`` may be granted (pure; on-policy).

    ``at`` is the job's weights version (trains ended), ``rolled`` its rollouts ended,
    ``running`` its phases in flight (started, maybe ended on the node but not yet seen
    ended here). On-policy, its phases are one sequence: rollout 0, train 0, rollout 1,
    ...; phase ``q`` of it may be granted when every phase before it ended (READY), may
    wait while only the other role's phase comes first (WAIT), and is refused otherwise.
    """
    what = f"{phase.value} at version {version} refused"
    if version >= steps:
        return Verdict.REFUSE, (f"{what}: the job ends at version {steps} (its spec's "
                                "iterations)")
    q = 2 * version + (phase is Phase.TRAIN)
    p = at + (Phase.TRAIN in running) + rolled + (Phase.ROLLOUT in running)
    if q == p:
        return (Verdict.WAIT if running else Verdict.READY), ""
    if q == p + 1:
        return Verdict.WAIT, ""       # the other role's phase comes first
    if q == p - 1 and phase in running:
        return Verdict.WAIT, ""       # granted: its process is picking the grant up
    if phase is Phase.ROLLOUT:
        return Verdict.REFUSE, (f"{what}: the job's weights are at version {at}; its next "
                                f"rollout is at version {(p + 1) // 2}")
    if q < p:
        return Verdict.REFUSE, (f"{what}: version {version} was trained already; the job "
                                f"is at version {at}")
    return Verdict.REFUSE, (f"{what}: no rollout at version {version} ended (on-policy: a "
                            f"train consumes the rollout of its own version); the job is "
                            f"at version {at}, its next train is at version {p // 2}")


@dataclass
class _Seen:
    """What the member's processes did, as its node daemons last said."""

    at_s: float = float("-inf")
    waiting: dict[Phase, int] = field(default_factory=dict)
    exited: dict[str, int] = field(default_factory=dict)     # role -> exit status
    left: set[Phase] = field(default_factory=set)   # its last grant ended (left its block)
    metrics: dict[str, float] = field(default_factory=dict)  # its last rollout's report


class Cooperative:
    """The runner's part for its cooperative members (see module doc)."""

    def __init__(self, lifecycle: Lifecycle, recovery: Recovery, clock: Clock) -> None:
        self.lc, self.recovery = lifecycle, recovery
        self.link = lifecycle.link
        self.clock = clock
        self.refusals: list[Refusal] = []
        self._seen: dict[str, _Seen] = {}

    @staticmethod
    def owns(member: RunningMember) -> bool:
        return member.spec.launch is not None

    @staticmethod
    def node_of(member: RunningMember, phase: Phase) -> NodeRef:
        """Where the member's process of ``phase`` runs."""
        return member.train_node if phase is Phase.TRAIN else member.rollout_nodes[0]

    def refusal(self, job_id: str, phase: Phase | None = None) -> str | None:
        """The job's last gate refusal (of ``phase``), in words; None: none."""
        return next((r.message for r in reversed(self.refusals) if r.job_id == job_id
                     and phase in (None, r.phase)), None)

    # -- the runner's hooks ------------------------------------------------------------
    def tick(self) -> bool:
        """Launch, read, refuse, end: every cooperative member (before recovery runs)."""
        changed = False
        for member in list(self.lc.members.values()):
            if not self.owns(member):
                continue
            try:
                changed |= self._tick_one(member)
            except WeaveError as exc:
                self.recovery.fail(member, Fault.from_error(exc, None, None, "the gate of"))
                changed = True
            if member.state is MemberState.RECOVERING:   # before the runner's recovery
                self._give_up(member)
        self._free_ports()
        return changed

    def ready(self, member: RunningMember, node: NodeRef) -> bool:
        """May the runner start ``member``'s next phase on ``node`` now?"""
        if not self.owns(member):
            return True
        kind = member.wants()
        seen = self._seen.get(member.spec.job_id)
        if kind is None or seen is None or node != self.node_of(member, kind):
            return False
        want = member.rolled if kind is Phase.ROLLOUT else member.version
        verdict, _ = self._judge(member, kind, want)
        return seen.waiting.get(kind) == want and verdict is Verdict.READY

    def grant(self, member: RunningMember, node: NodeRef, kind: Phase, step: int) -> None:
        """The runner's activation of a cooperative phase: the waiting process goes on."""
        self.link.call(node, Op.ACTIVATE, job=member.spec.job_id, phase=kind.value,
                       external=True, version=step, step=step)
        self._seen[member.spec.job_id].waiting.pop(kind, None)

    def finish(self, member: RunningMember, run: PhaseRun, result: dict[str, object]) -> None:
        """A phase the process handed back (the runner logged its span already)."""
        move = self.lc.move
        seen = self._seen.setdefault(member.spec.job_id, _Seen())
        if run.kind is Phase.ROLLOUT:
            seen.metrics = _metrics(result)
            member.rolled = member.delivered = run.step + 1
            member.next_kind = Phase.TRAIN
            move(member, MemberState.READY, f"rollout at version {run.step} done")
            return
        produced = result.get("produced")
        if produced is not None and produced != run.step + 1:
            raise VersionMismatch(f"train at version {run.step} reported producing version "
                                  f"{produced}; a train produces version {run.step + 1}")
        member.version = run.step + 1
        if member.versions is not None:
            member.versions.consumed(run.step, run.step)
        metrics = {**seen.metrics, **_metrics(result)}   # the iteration's: both turns'
        seen.metrics = {}
        member.rewards.append(metrics.get("reward_mean", float("nan")))
        self.lc.profiler.iteration_end(member.spec.job_id, self.clock.now())
        member.next_kind = Phase.ROLLOUT
        move(member, MemberState.READY, f"train -> v{member.version}")

    # -- one member ----------------------------------------------------------------------
    def _tick_one(self, member: RunningMember) -> bool:
        if member.repin is not None:   # its rollout process runs where it was started
            member.warn(f"it stays on its rollout node {member.rollout_nodes[0].name} (its "
                        "process runs there): the group's re-pin is not followed")
            member.repin = None
        if member.state is MemberState.STARTING and not member.initialised:
            self._launch(member)
            return True
        if member.state is MemberState.RECOVERING:
            return True      # tick() gives it up
        if member.state not in (MemberState.READY, MemberState.ROLLOUT, MemberState.TRAIN):
            return False
        now = self.clock.now()
        seen = self._seen.setdefault(member.spec.job_id, _Seen())
        if now - seen.at_s < POLL_S:
            return False
        seen.at_s = now
        self._read(member, seen)
        changed = self._refuse(member, seen)
        return self._exits(member, seen) or changed

    def _launch(self, member: RunningMember) -> None:
        plan = member.spec.launch
        assert plan is not None
        owner = {} if member.spec.uid is None else {"uid": member.spec.uid}
        where = []
        net = MemberNet(node_addr(member.train_node), node_addr(member.rollout_nodes[0]),
                        SLOTS.take(self, member.spec.job_id))
        for role, _ in plan.commands:   # registered without a resident worker: none runs
            node = self.node_of(member, PHASE_OF[role])
            self.link.call(node, Op.REGISTER, job=member.spec.job_id, checkpoint_interval_s=0,
                           resident=False, **owner)
            self.link.call(node, Op.LAUNCH, job=member.spec.job_id,   # its GPUs there
                           gpus=member.spec.gpus_on(PHASE_OF[role]),
                           **plan.request(role, net.env(role)))
            where.append(f"{role} on {node.name}")
        member.initialised, member.next_kind = True, Phase.ROLLOUT
        self._seen[member.spec.job_id] = _Seen()
        self.lc.move(member, MemberState.READY, "its processes started: " + ", ".join(where))

    def _read(self, member: RunningMember, seen: _Seen) -> None:
        seen.waiting.clear()
        for phase in (Phase.TRAIN, Phase.ROLLOUT):
            reply = self.link.call(self.node_of(member, phase), Op.PHASE,
                                   job=member.spec.job_id)
            gate = dict(reply.get("gate") or {})
            if dict(reply.get("worker") or {}).get("state") == WorkerState.EXITED.value:
                seen.left.add(phase)
            else:
                seen.left.discard(phase)
            version = dict(gate.get("waiting") or {}).get(phase.value)
            if isinstance(version, int):
                seen.waiting[phase] = version
            proc = dict(dict(gate.get("procs") or {}).get(ROLE[phase]) or {})
            if proc.get("returncode") is not None:
                seen.exited[ROLE[phase]] = int(proc["returncode"])

    def _judge(self, member: RunningMember, phase: Phase, version: int) -> tuple[Verdict, str]:
        return judge(phase, version, at=member.version, rolled=member.rolled,
                     steps=member.spec.steps, running=frozenset(member.runs))

    def _refuse(self, member: RunningMember, seen: _Seen) -> bool:
        refused = False
        for phase, version in list(seen.waiting.items()):
            verdict, why = self._judge(member, phase, version)
            if verdict is not Verdict.REFUSE:
                continue
            self.link.call(self.node_of(member, phase), Op.GATE, job=member.spec.job_id,
                           action="refuse", phase=phase.value, version=version, message=why)
            del seen.waiting[phase]
            self.refusals.append(Refusal(member.spec.job_id, phase, version, why,
                                         self.clock.now()))
            log.warning("job %s: %s", member.spec.job_id, why)
            refused = True
        return refused

    def _exits(self, member: RunningMember, seen: _Seen) -> bool:
        if not seen.exited:
            return False
        if self._work_done(member, seen):
            return True
        for role, rc in seen.exited.items():
            phase = PHASE_OF[role]
            # a process that left its phase's block and then ended (its last phase:
            # the runner reads that grant's end next) does not hold it
            holding = phase in member.runs and not member.runs[phase].ended \
                and phase not in seen.left
            if rc != 0 or holding:
                self.recovery.fail(member, self._exit_fault(member, phase, rc, holding))
                return True
        want = member.wants()
        if member.runs or (want is not None and ROLE[want] not in seen.exited):
            return False   # its other process still has work to do
        if len(seen.exited) < len(ROLE) and member.version < member.spec.steps:
            ended = ", ".join(sorted(seen.exited))
            self._stop(member)
            member.error = (f"its {ended} process ended (status 0) at version "
                            f"{member.version}, before its {member.spec.steps} iterations")
            self.lc.move(member, MemberState.RECOVERING, member.error)
            return True
        if len(seen.exited) < len(ROLE):
            return False   # past its iterations: the other process ends on its own
        self.lc.move(member, MemberState.DONE, f"its processes ended at version "
                     f"{member.version}")
        return True

    def _exit_fault(self, member: RunningMember, phase: Phase, rc: int, holding: bool) -> Fault:
        """A process that exited holding its phase or non-zero: after a refusal of its
        phase, the refusal is the fault (its words are the reason it exited)."""
        node, role = self.node_of(member, phase).name, ROLE[phase]
        refused = None if holding else self.refusal(member.spec.job_id, phase)
        if refused is not None:
            return Fault(FaultKind.VERSION_REFUSED, node, phase, rc,
                         evidence=f"its {role} process on {node} exited with status {rc} "
                                  f"after its gate refused it: {refused}")
        return Fault(FaultKind.WORKER_EXITED, node, phase, rc,
                     evidence=f"its {role} process exited with status {rc}"
                              + (f" holding its {phase.value} phase" if holding else ""))

    def _work_done(self, member: RunningMember, seen: _Seen) -> bool:
        """The End rule (module doc): its driver exited 0 after its iterations."""
        if seen.exited.get(ROLE[Phase.TRAIN]) != 0 or member.runs \
                or member.version < member.spec.steps:
            return False
        rollout = ROLE[Phase.ROLLOUT]
        stopped = "" if rollout in seen.exited else f"; its {rollout} process was stopped"
        if stopped:
            self._stop(member)
        self.lc.move(member, MemberState.DONE, f"its train process ended (status 0) at "
                     f"version {member.version}{stopped}")
        return True

    def _free_ports(self) -> None:
        """Port ranges of members that ended (or left) go back (runtime/member_net.py)."""
        live = {j for j, m in self.lc.members.items() if m.state not in _ENDED}
        for job in SLOTS.held(self) - live:
            SLOTS.give(self, job)

    def _give_up(self, member: RunningMember) -> None:
        """Recovery for a cooperative member: stop its processes; FAILED (see module doc)."""
        self._stop(member)
        member.outcome = ("its processes were stopped: weave holds no state of a "
                          "cooperative job to re-admit it from")
        self.lc.move(member, MemberState.FAILED, member.error or "failed")

    def _stop(self, member: RunningMember) -> None:
        for phase in (Phase.TRAIN, Phase.ROLLOUT):
            self.link.best_effort(self.node_of(member, phase), Op.LAUNCH,
                                  job=member.spec.job_id, action="stop")


def _metrics(result: dict[str, object]) -> dict[str, float]:
    """The numbers a turn reported (``turn.report``; the node daemon checked them)."""
    metrics = result.get("metrics")
    if not isinstance(metrics, dict):
        return {}
    return {str(k): float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
