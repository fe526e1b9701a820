"""The group runtime inside weaved: one :class:`GroupExecutor` per active group.

:class:`RuntimeExecutor` implements the reconcile loop's :class:`Executor` seam. A
placed job needs no step of its own (``job_steps`` returns none): its phases run in
resident workers on the node daemons weaved launched for its group's allocations.

- :meth:`RuntimeExecutor.drive` (called by the reconcile loop, which owns the store)
  builds a group's executor once its node daemons answer, joins each RUNNING job
  (spec: entry point, seed, iterations, options; pins from the group's plan), makes
  cancelled and ended jobs leave (their workers, segments and checkpoints dropped
  on every node), and reports members that reached their iterations (COMPLETED) or
  gave up (FAILED). After a weaved restart a RUNNING job whose warm state is still
  on its training node is re-attached: re-admitted from its newest node checkpoint.
- A runtime thread (:meth:`start`) ticks every group executor every ``poll_s``, so
  phases hand over in milliseconds while the reconcile loop ticks once a second;
  it wakes the loop when a member ends. Both threads share one lock.
- :meth:`live` is what ``weave status`` / ``weave show job`` read: phase, version,
  the four measured quantities, live slowdown vs SLO and drift flags (a snapshot
  refreshed by the runtime thread; API threads never touch a node daemon).
- Live profiles feed back into placement: once a member has enough measured phases
  and they moved, :meth:`drive` stores them as the job's planning profile
  (:func:`~weave_slurm.runtime.profiler.planning_profile`), which the next placement
  decisions (arrivals packed next to it, consolidation) use instead of the declared one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weave_slurm.config.job import parse_job
from weave_slurm.daemon.executor import JobOutcome, JobStep, pool_nodes
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import WeaveError
from weave_slurm.runtime.executor import ExecutorConfig, GroupExecutor, Member
from weave_slurm.runtime.group import (
    DeclaredProfile,
    GroupLayout,
    MemberSpec,
    MemberState,
    NodeRef,
    Pool,
)
from weave_slurm.runtime.profiler import planning_profile
from weave_slurm.runtime.timeline import Span

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

_PHASE = {MemberState.STARTING: "init", MemberState.READY: "idle",
          MemberState.ROLLOUT: "rollout", MemberState.TRAIN: "train",
          MemberState.RECOVERING: "recover", MemberState.DONE: "done",
          MemberState.FAILED: "failed", MemberState.CANCELLED: "left"}
_ENDED = (JobState.CANCELLING, JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED)


@dataclass(frozen=True)
class RuntimeConfig:
    poll_s: float = 0.01           # runtime thread tick when nothing changed
    snapshot_s: float = 0.2        # how often the status snapshot is refreshed
    ping_timeout_s: float = 2.0    # a node daemon must answer this fast to build a group
    # each node daemon's checkpoint root is <checkpoint_base>/<node>, on a file system
    # weaved shares with the nodes: a member whose training node is lost is re-admitted
    # on the replacement from its last checkpoint there (None: it fails instead)
    checkpoint_base: Path | None = None
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)


def member_spec(job: JobRow, group: GroupRow) -> MemberSpec:
    """The runtime's view of a stored job: its spec's entry, seed, iterations, options."""
    spec = parse_job(job.spec, job.source)
    pins = next((m.rollout_pins for m in group.plan.members if m.job_id == job.job_id), (0,))
    return MemberSpec(str(job.job_id), entry_point=spec.entry, seed=spec.seed,
                      steps=spec.iterations, options=dict(spec.options),
                      staleness=spec.staleness, uid=job.uid,
                      rollout_pins=tuple(pins) or (0,), train_node=0,
                      declared=DeclaredProfile(job.profile.rollout_mean_s or None,
                                               job.profile.train_mean_s or None,
                                               job.profile.slo))


_PHASE_END = re.compile(r"^(rollout|train) on (\S+) (killed|failed): returncode (-?\d+|None)$")
_GONE = re.compile(r"daemon at '?\S*?node-([^/\s']+?)\.sock'?:? (?:is gone: )?(.*)$")


def fault_words(why: str) -> str:
    """A runtime failure message as a sentence: which worker or daemon, what, when."""
    m = _PHASE_END.match(why)
    if m is not None:
        phase, node, how, rc = m.groups()
        if rc == "None":   # the worker's socket closed before its exit status arrived
            return f"worker on node {node} {how} during {phase} (exit status not known)"
        code = int(rc)
        if code < 0:
            name = signal_name(-code)
            return f"worker on node {node} killed by signal {-code} ({name}) during {phase}"
        return f"worker on node {node} exited with code {code} during {phase}"
    m = _GONE.search(why)
    if m is not None:
        return f"node daemon on node {m.group(1)} stopped answering ({m.group(2)})"
    return why


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def member_event(m: Member) -> str | None:
    """The member's last fault and what was done about it, in words (None: no fault)."""
    fault: str | None = None
    outcome: str | None = None
    for _, state, why in m.history:
        if state is MemberState.RECOVERING:
            fault, outcome = fault_words(why), None
        elif fault is not None and why.startswith("re-admitted"):
            outcome = why
        elif fault is not None and state is MemberState.FAILED:
            outcome = "gave up"
    if fault is None:
        return None
    if outcome is None:
        return f"{fault}; recovering (attempt {m.recoveries}: {m.error})" \
            if m.error and m.error != fault and m.recoveries else f"{fault}; recovering"
    return f"{fault}; {outcome}"


def weights_digest(tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 over names and raw bytes, in name order: equal iff bit-identical."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(-1).view(torch_uint8()).numpy().tobytes())
    return h.hexdigest()


def torch_uint8() -> Any:
    import torch

    return torch.uint8


class RuntimeExecutor:
    """The :class:`~weave_slurm.daemon.executor.Executor` that runs RL phases."""

    phase = "rl"

    def __init__(self, node_socket: Callable[[AllocRow, str], Path],
                 config: RuntimeConfig | None = None) -> None:
        self.node_socket = node_socket
        self.config = config or RuntimeConfig()
        self.groups: dict[int, GroupExecutor] = {}     # active groups
        self.spans: dict[int, list[Span]] = {}         # group id -> spans (kept after end)
        self.wake: Callable[[], None] = lambda: None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: dict[int, dict[str, Any]] = {}
        self._readmit_why: dict[int, str] = {}   # job -> why it is re-attached (words)
        self._carry: dict[int, Path] = {}         # job -> checkpoint root of its lost node
        self._init_restarts: dict[int, int] = {}  # job -> fresh restarts after a killed init
        self._restarted: dict[int, str] = {}      # job -> why it was restarted (words)
        self._snap_at = 0.0

    # -- the Executor seam -----------------------------------------------------------
    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]:
        return []

    def drive(self, store: Store, now: float) -> list[JobOutcome]:
        """Membership from the store: join, leave, and the jobs that ended."""
        outcomes: list[JobOutcome] = []
        with self._lock:
            live_groups = {g.group_id: g for g in store.groups()}
            for gid in [g for g in self.groups if g not in live_groups
                        or live_groups[g].state in (GroupState.DRAINING, GroupState.RELEASED)]:
                self._close(gid)
            for gid in [g for g in self.groups if g in live_groups]:
                outcomes += self._detach_if_lost(gid, live_groups[gid],
                                                 store.allocs(gid), store)
            for group in live_groups.values():
                if group.state is GroupState.ACTIVE and group.group_id not in self.groups:
                    self._build(group, store.allocs(group.group_id))
                gx = self.groups.get(group.group_id)
                if gx is None:
                    continue
                for job in store.jobs(group_id=group.group_id):
                    outcome = self._member_of(gx, group, job)
                    if outcome is not None:
                        outcomes.append(outcome)
                    elif job.state is JobState.RUNNING:
                        self._feed_back(store, gx, job)
            self._snapshot(force=True)
        return outcomes

    def _build(self, group: GroupRow, allocs: Sequence[AllocRow]) -> None:
        refs = {role: [NodeRef(node, pool, self.node_socket(a, node))
                       for a, node in pool_nodes(allocs, role)]
                for role, pool in (("rollout", Pool.ROLLOUT), ("train", Pool.TRAIN))}
        if not refs["rollout"] or not refs["train"]:
            return
        layout = GroupLayout(tuple(refs["rollout"]), tuple(refs["train"]))
        if not all(self._answers(r) for r in (*layout.rollout, *layout.train)):
            return   # node daemons still starting: the next tick tries again
        gx = GroupExecutor(layout, [], config=self.config.executor)
        gx.listeners.append(self._on_move)
        self.groups[group.group_id] = gx
        self.spans[group.group_id] = gx.spans
        log.info("group %s: runtime attached to %d rollout and %d training node(s)",
                 group.group_id, len(layout.rollout), len(layout.train))

    def _detach_if_lost(self, gid: int, group: GroupRow, allocs: Sequence[AllocRow],
                        store: Store) -> list[JobOutcome]:
        """A node of the group's layout is no longer in a held allocation (the allocation
        was lost, e.g. its node went down): stop driving the group without dropping any
        state. Members whose training node survived keep their warm state and checkpoint
        and are re-admitted from it once the group is active on a new allocation. Members
        whose training node was lost are re-admitted on the new training node from their
        newest checkpoint under the lost node's root (``checkpoint_base``, a shared file
        system), start again from scratch when lost in their first phase, and fail
        otherwise (no checkpoint that weaved can see)."""
        gx = self.groups[gid]
        held = {n for a in allocs if a.state is AllocState.HELD for n in a.nodes}
        lost = [r for r in (*gx.layout.rollout, *gx.layout.train) if r.name not in held]
        if not lost:
            return []
        names = ", ".join(f"{r.pool.value} node {r.name}" for r in lost)
        log.warning("group %s: lost %s; detaching its runtime until it is active again",
                    gid, names)
        outcomes = []
        for key in list(gx.order):
            member = gx.members[key]
            if member.state in (MemberState.DONE, MemberState.FAILED):
                outcomes.append(self._ended(gx, int(key), member))
                continue
            row = {**self._row(gx, member), "phase": "recover"}
            carry = self._carried_checkpoint(member) if member.train_node in lost else None
            if member.train_node in lost and carry is None and not member.initialised:
                # nothing learned yet: a fresh join on the new allocation loses nothing
                why = (f"its training node {member.train_node.name} was lost during its "
                       "first phase (allocation vanished from Slurm); waiting for a new "
                       "allocation, then started again from scratch")
                row["event"] = why
                self._restarted[int(key)] = (f"its training node {member.train_node.name} "
                                             "was lost during its first phase; restarted "
                                             "from scratch")
            elif member.train_node in lost and carry is None:
                why = (f"its training node {member.train_node.name} was lost with its warm "
                       "state, and no checkpoint of it is on a shared file system "
                       "(allocation vanished from Slurm); not resumable")
                row["event"] = why
                outcomes.append(JobOutcome(int(key), JobState.FAILED, why))
            elif carry is not None:
                root, version = carry
                self._carry[int(key)] = root
                why = (f"{names} lost (allocation vanished from Slurm), with its training "
                       f"state; waiting for a new allocation, then re-admitted there from "
                       f"its last checkpoint (v{version}, {root})")
                row["event"] = why
                self._readmit_why[int(key)] = (
                    f"{names} lost; re-admitted on a new training node from its last "
                    f"checkpoint (v{version})")
            else:
                why = (f"{names} lost (allocation vanished from Slurm); waiting for a new "
                       "allocation, then re-admitted from its checkpoint")
                row["event"] = why
                self._readmit_why[int(key)] = f"{names} lost; re-attached on a new allocation"
            self._live[int(key)] = row
        gx.close()
        del self.groups[gid]
        return outcomes

    def _carried_checkpoint(self, member: Member) -> tuple[Path, int] | None:
        """(checkpoint root, version) of the member's newest checkpoint on its lost
        training node, when weaved can see that node's root (None: no such checkpoint)."""
        from weave_slurm.node.checkpoint import CheckpointStore
        from weave_slurm.runtime import phases

        base = self.config.checkpoint_base
        if base is None:
            return None
        root = base / member.train_node.name
        try:
            store = CheckpointStore(root)
            info = store.read(store.latest(member.job))
        except (WeaveError, OSError):
            return None
        version = info.versions.get(phases.STATE)
        return (root, version) if version is not None else None

    def _answers(self, ref: NodeRef) -> bool:
        from weave_slurm.node.client import NodeClient
        from weave_slurm.node.protocol import Op

        try:
            with NodeClient(ref.socket_path, timeout_s=self.config.ping_timeout_s) as client:
                client.call(Op.STATUS)
        except (WeaveError, OSError):
            return False
        return True

    def _member_of(self, gx: GroupExecutor, group: GroupRow, job: JobRow) -> JobOutcome | None:
        key = str(job.job_id)
        member = gx.members.get(key)
        if job.state is JobState.RUNNING:
            if member is None:
                try:
                    self._join(gx, job, group)
                except WeaveError as exc:
                    return JobOutcome(job.job_id, JobState.FAILED, f"cannot join: {exc}")
                return None
            if self._restart_init(gx, group, job, member):
                return None
            if member.state in (MemberState.DONE, MemberState.FAILED):
                return self._ended(gx, job.job_id, member)
        elif job.state in _ENDED and member is not None \
                and member.state is not MemberState.CANCELLED:
            self._leave(gx, job.job_id)
        return None

    @staticmethod
    def _feed_back(store: Store, gx: GroupExecutor, job: JobRow) -> None:
        """Store what the runtime measured as the job's planning profile, once it has
        enough samples and it moved (placement's later decisions read it)."""
        measured = gx.profiler.snapshot().get(str(job.job_id))
        if measured is None:
            return
        new = planning_profile(job.plan_profile, job.profile, measured)
        if new is not None:
            store.set_measured(job.job_id, new)
            log.info("job %s: planning profile from measurements: rollout %.3f/%.3f s, "
                     "train %.3f/%.3f s (mean/max)", job.job_id, new.rollout_mean_s,
                     new.rollout_max_s, new.train_mean_s, new.train_max_s)

    def _ended(self, gx: GroupExecutor, job_id: int, member: Member) -> JobOutcome:
        """A DONE or FAILED member leaves; its outcome, with its faults in words."""
        done = member.state is MemberState.DONE
        why = (f"reached version {member.version}/{member.spec.steps}" if done
               else f"runtime gave up: {fault_words(member.error or 'unknown')}")
        event = member_event(member)
        n = member.recoveries
        if event is not None:
            why += f" after {n} recover{'y' if n == 1 else 'ies'} (last: {event})"
        if job_id in self._restarted:
            why += f"; earlier: {self._restarted[job_id]}"
        self._leave(gx, job_id)
        return JobOutcome(job_id, JobState.COMPLETED if done else JobState.FAILED, why)

    def _restart_init(self, gx: GroupExecutor, group: GroupRow, job: JobRow,
                      member: Member) -> bool:
        """A member whose worker or node daemon died during its first (init) phase has
        no checkpoint to be re-admitted from: start it again from scratch, as a fresh
        init is what it was doing (twice at most; other init failures stay FAILED)."""
        if member.state is not MemberState.FAILED:
            return False
        words = fault_words(member.error or "")
        killed = words.startswith("worker on node") and " killed" in words
        no_ckpt = "has no checkpoint" in words   # re-attached, but killed before its first
        if not no_ckpt and (member.initialised or not (   # checkpoint was written
                killed or words.startswith("node daemon on node"))):
            return False
        if no_ckpt:
            words = "weaved restarted before its first checkpoint"
        tries = self._init_restarts.get(job.job_id, 0)
        if tries >= 2:
            return False
        self._init_restarts[job.job_id] = tries + 1
        self._restarted[job.job_id] = (f"{words} during its first phase; restarted from "
                                       f"scratch (no checkpoint yet, restart {tries + 1})")
        log.warning("job %s: %s", job.job_id, self._restarted[job.job_id])
        self._leave(gx, job.job_id)
        self._join(gx, job, group)
        return True

    def _join(self, gx: GroupExecutor, job: JobRow, group: GroupRow) -> None:
        from weave_slurm.node.protocol import Op
        from weave_slurm.runtime import phases

        member = gx.join(member_spec(job, group))
        try:
            info = gx.client(member.train_node.socket_path).call(Op.ATTACH_INFO,
                                                                 job=member.spec.job_id)
            held = phases.STATE in dict(info.get("segments") or {})
            known = True
        except (WeaveError, OSError):
            held = known = False
        carry = self._carry.pop(job.job_id, None)
        if not held and carry is not None:
            held = self._adopt(gx, member, carry)
            if not held:
                self._readmit_why.pop(job.job_id, None)
                self._restarted[job.job_id] = (
                    "its training node was lost and its last checkpoint could not be "
                    "moved to the new one; restarted from scratch")
        if held:
            self._reattach(gx, member, self._readmit_why.pop(job.job_id,
                                                             "re-attached after a weaved restart"))
        elif known:
            # no warm state yet, but a previous weaved may have left its first phase
            # running: drop it (worker killed, whatever it had written removed), so the
            # fresh start begins from nothing
            for node in (member.train_node, *member.rollout_nodes):
                with contextlib.suppress(WeaveError, OSError):
                    gx.client(node.socket_path).call(Op.DROP, job=member.spec.job_id)
        log.info("job %s joined group %s%s", job.job_id, group.group_id,
                 " (re-attached to its warm state)" if held else "")

    def _adopt(self, gx: GroupExecutor, member: Member, root: Path) -> bool:
        """Move the member's last checkpoint from its lost training node's root to its
        new training node; True when it can be restored there."""
        from weave_slurm.node.protocol import Op

        base = self.config.checkpoint_base
        if base is not None and root == base / member.train_node.name:
            return True   # the same node came back: its checkpoints are where they were
        client = gx.client(member.train_node.socket_path)
        try:
            client.call(Op.REGISTER, job=member.spec.job_id, uid=member.job.uid,
                        checkpoint_interval_s=0)
            info = client.call(Op.ADOPT, job=member.spec.job_id, from_root=str(root))
        except (WeaveError, OSError) as exc:
            log.warning("job %s: its checkpoint under %s could not be moved to %s: %s",
                        member.spec.job_id, root, member.train_node.name, exc)
            return False
        log.info("job %s: checkpoint %s moved to %s (%s)", member.spec.job_id,
                 info.get("versions"), member.train_node.name, info.get("path"))
        return True

    def _reattach(self, gx: GroupExecutor, member: Member,
                  why: str = "re-attached after a weaved restart") -> None:
        """A job left running by a previous weaved: stop its phase, resume from checkpoint."""
        from weave_slurm.node.protocol import Op

        for node in (member.train_node, *member.rollout_nodes):
            with contextlib.suppress(WeaveError, OSError):
                gx.client(node.socket_path).call(Op.DEACTIVATE, job=member.spec.job_id)
        # GroupExecutor has no public adopt(): mark the warm state as existing and let
        # its own recovery restore the newest checkpoint and re-sync the weights
        member.initialised = True
        member.history.append((gx.clock.now(), MemberState.RECOVERING, why))
        member.state = MemberState.RECOVERING

    def _leave(self, gx: GroupExecutor, job_id: int) -> None:
        key = str(job_id)
        member = gx.members[key]
        final = {**self._row(gx, member), "phase": "-"}
        if member.state is MemberState.DONE:   # record what it learned before the drop
            try:
                final["weights_sha256"] = self._final_digest(gx, member)
            except (WeaveError, OSError) as exc:
                log.warning("job %s: cannot read its final weights: %s", job_id, exc)
        self._live[job_id] = final
        try:
            gx.leave(key)
        except WeaveError as exc:
            log.warning("leave of job %s: %s", job_id, exc)

    @staticmethod
    def _final_digest(gx: GroupExecutor, member: Member) -> str:
        from weave_slurm.runtime import phases

        seg = gx.client(member.train_node.socket_path).attach(member.job)[phases.WEIGHTS]
        return weights_digest(seg.tensors)

    def release_group(self, group_id: int) -> None:
        """The group drains: leave (drop) its members now, while its node daemons still
        answer; the next ``drive`` would be too late (their steps are ended first)."""
        with self._lock:
            if group_id in self.groups:
                self._close(group_id)

    def _close(self, gid: int) -> None:
        gx = self.groups.pop(gid)
        for key in list(gx.order):
            self._leave(gx, int(key))
        gx.close()

    def _on_move(self, member: Member, why: str) -> None:
        if member.state in (MemberState.DONE, MemberState.FAILED):
            self.wake()

    # -- the runtime thread ----------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="weaved-runtime",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop ticking; node daemons and members stay (a restart re-attaches)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._lock:
            for gx in self.groups.values():
                gx.close()

    def tick(self) -> bool:
        """One pass over every group executor; True if anything changed."""
        changed = False
        with self._lock:
            for gid, gx in list(self.groups.items()):
                try:
                    changed |= gx.tick()
                except Exception:
                    log.exception("group %s: runtime tick failed; retrying", gid)
            self._snapshot()
        return changed

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.tick():
                self._stop.wait(self.config.poll_s)

    # -- the read side ---------------------------------------------------------------
    def _row(self, gx: GroupExecutor, m: Member) -> dict[str, Any]:
        prof = gx.profiler.snapshot().get(m.spec.job_id)
        st = next((r for r in gx.status() if r["job"] == m.spec.job_id), {})
        row: dict[str, Any] = {
            "phase": _PHASE[m.state], "iterations": m.spec.steps,
            # unknown (None) until a re-attached member is restored from its checkpoint
            "version": None if m.state is MemberState.RECOVERING and m.recoveries == 0
            and m.initialised else m.version,
            "node": st.get("node"), "reward": m.rewards[-1] if m.rewards else None,
            "rewards": list(m.rewards), "recoveries": m.recoveries, "error": m.error,
            "member_state": m.state.value,
            "event": member_event(m) or self._restarted.get(int(m.spec.job_id)),
            "current_staleness": st.get("current_staleness")}
        if prof is not None:
            row.update({"slowdown": prof.slowdown, "slo_ok": prof.slo_ok,
                        "drift": list(prof.drift), "measured": prof.to_json()})
        return row

    def _snapshot(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._snap_at < self.config.snapshot_s:
            return
        self._snap_at = now
        live = dict(self._live)
        for gx in self.groups.values():
            for key, m in gx.members.items():
                if m.state is not MemberState.CANCELLED:
                    live[int(key)] = self._row(gx, m)
        self._live = live

    def live(self, job_id: int) -> dict[str, Any] | None:
        """The runtime's view of a job for status (None: never ran here)."""
        return self._live.get(job_id)
