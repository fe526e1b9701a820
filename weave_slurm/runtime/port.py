"""The one door between weaved and a group's runtime: commands in, events out.

weaved's group runtime (``daemon/group_runtime.py``) drives each group's runtime only
through a :class:`GroupPort`, in the manner of Ray autoscaler v2's instance manager:

- **One writer.** Only the port changes the runtime from outside: every change weaved
  asks for is a command value (:mod:`~weave_slurm.runtime.port_commands`) applied through
  :meth:`GroupPort.apply`, every input passed in with it. Inside, the group runner's
  loop (:meth:`GroupPort.tick`) starts and ends phases; the member's owner
  (:class:`~weave_slurm.runtime.lifecycle.Lifecycle`), recovery and re-layout carry out
  the rest.
- **Events out.** What happened is reported as event values
  (:mod:`~weave_slurm.runtime.port_events`): a member changed state, ended, faulted, was
  handed off or detached; :meth:`apply` and :meth:`tick` return the events since the
  last call, in order. weaved turns them into store rows; it registers no callback.
- **Snapshots to read.** weaved's status reads :class:`~weave_slurm.runtime.
  member_view.MemberView` values (:attr:`GroupPort.members`), never a live member.

::

        weaved (daemon/)                      the group's runtime (runtime/)
    store rows --> commands --apply()--> GroupPort --> Lifecycle   (state owner)
                                            |     \\-> Recovery    (faults)
                                            |     \\-> Relayout    (nodes, pins)
                                            |     \\-> GroupRunner (tick: phases)
    store rows <-- events  <--apply()/tick()-'
    status     <-- MemberView snapshots (members)

The runtime tests drive a port with commands and a virtual clock
(tests/runtime/test_port.py); the runtime's own tests and benchmarks may also tick a
:class:`~weave_slurm.runtime.runner.GroupRunner` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weave_slurm.clock import Clock
from weave_slurm.hosted import contract
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.agents import Launcher
from weave_slurm.runtime.group import GroupLayout
from weave_slurm.runtime.member import RunnerConfig
from weave_slurm.runtime.member_view import MemberView, view_of
from weave_slurm.runtime.nodes import Resolver
from weave_slurm.runtime.port_commands import (
    Adopt,
    Command,
    Detach,
    Drop,
    Extend,
    Fail,
    FinalDigest,
    HandOff,
    Join,
    Leave,
    Repin,
    Retire,
    SetTurns,
    TakeHandOffs,
)
from weave_slurm.runtime.port_events import Detached, Digested, Event, HandedOff
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.runtime.timeline import Span, TimelineObserver


@dataclass(frozen=True)
class Tick:
    """One pass of a group's loop: whether anything changed (a phase started, ended or
    moved data, a member changed state), and the events it caused."""

    changed: bool
    events: tuple[Event, ...]


class GroupPort:
    """weaved's door to one group's runtime (see module doc)."""

    def __init__(self, runner: GroupRunner) -> None:
        self.runner = runner
        self._pending: list[Event] = []   # the port's own events (results of commands)

    @classmethod
    def open(cls, layout: GroupLayout, *, config: RunnerConfig | None = None,
             clock: Clock | None = None, launcher: Launcher | None = None,
             resolve: Resolver | None = None, observer: TimelineObserver | None = None,
             client_factory: Callable[[Path], Any] | None = None) -> GroupPort:
        """A port to a new runtime over ``layout``, with no member yet."""
        return cls(GroupRunner(layout, [], clock=clock, config=config, launcher=launcher,
                               resolve=resolve, observer=observer,
                               client_factory=client_factory))

    # -- the write side --------------------------------------------------------------
    def apply(self, *commands: Command) -> list[Event]:
        """Carry out ``commands`` in order; the events since the last call. A command
        that cannot be carried out raises (the ones before it stand, the events they
        caused are returned by the next call)."""
        out: list[Event] = []
        try:
            for command in commands:
                out += self._one(command)
        finally:
            self._pending += out
        return self.events()

    def tick(self) -> Tick:
        """One pass of the group's loop (read the world, then act)."""
        changed = self.runner.tick()
        return Tick(changed, tuple(self.events()))

    def events(self) -> list[Event]:
        """Every event since the last call: the members' changes in the order they
        happened, then what the commands answered (``HandedOff``, ``Detached``, ...)."""
        pending, self._pending = self._pending, []
        return [*self.runner.lifecycle.outbox.drain(), *pending]

    def close(self) -> None:
        """Stop the runtime's connections; its members stay on their nodes."""
        self.runner.close()

    def _one(self, command: Command) -> list[Event]:
        runner = self.runner
        lc = runner.lifecycle
        match command:
            case Join(spec=spec):
                lc.join(spec)
            case Adopt(spec=spec, resume=resume):
                lc.adopt(spec, resume)
            case Leave(job_id=job_id):
                lc.leave(job_id)
            case Fail(job_id=job_id, fault=fault):
                runner.recovery.fail(lc.member(job_id), fault)
            case HandOff(job_id=job_id):
                lc.hand_off(job_id)
            case TakeHandOffs(checkpoint_base=base, source=source):
                return [HandedOff(k, r) for k, r in lc.hand_offs(base, source).items()]
            case Drop(job_id=job_id):
                for node in (*runner.layout.train, *runner.layout.rollout):
                    runner.link.best_effort(node, Op.DROP, job=job_id)
            case Repin(job_id=job_id, pins=pins, pool=pool):
                runner.relayout.repin(lc.member(job_id), pins, pool)
            case SetTurns(job_id=job_id, turns=turns):
                lc.set_turns(job_id, turns)
            case Extend(nodes=nodes):
                runner.extend(nodes)
            case Retire(names=names):
                runner.retire(names)
            case Detach(lost=lost, checkpoint_base=base):
                return [Detached(k, r) for k, r in lc.detach(lost, base).items()]
            case FinalDigest(job_id=job_id):
                reply = runner.link.call(lc.member(job_id).train_node, Op.DIGEST,
                                         job=job_id, name=contract.WEIGHTS)
                return [Digested(job_id, str(reply["sha256"]))]
        return []

    # -- the read side ---------------------------------------------------------------
    @property
    def layout(self) -> GroupLayout:
        """The group's nodes now (a frozen value)."""
        return self.runner.layout

    @property
    def spans(self) -> list[Span]:
        """The group's timeline: every phase and copy that ended (appended to)."""
        return self.runner.spans

    @property
    def clock(self) -> Clock:
        """The runtime's clock (the timeline's times are on it)."""
        return self.runner.clock

    def in_flight(self, now: float) -> list[Span]:
        """The phases running now, as spans up to ``now`` (busy, though not recorded
        yet): what the metrics' bubbles count besides :attr:`spans`."""
        return [Span(m.spec.job_id, run.kind, run.node.name, run.node.pool, run.start_s, now)
                for m in list(self.runner.members.values()) for run in list(m.runs.values())
                if not run.ended]

    @property
    def order(self) -> tuple[str, ...]:
        """The members in the group's cyclic order (those that left are not in it)."""
        return tuple(self.runner.lifecycle.order)

    @property
    def members(self) -> dict[str, MemberView]:
        """A snapshot of every member the runtime holds (those that left too)."""
        measured = self.runner.profiler.snapshot()
        refusal = self.runner.coop.refusal
        return {k: view_of(m, measured.get(k), refusal(k))
                for k, m in list(self.runner.members.items())}

    def view(self, job_id: str) -> MemberView | None:
        """A snapshot of one member (None: the runtime does not hold it)."""
        m = self.runner.members.get(job_id)
        if m is None:
            return None
        return view_of(m, self.runner.profiler.snapshot().get(job_id),
                       self.runner.coop.refusal(job_id))

    def nodes_in_use(self) -> set[str]:
        """Names of the nodes some member is on, moving to or runs a phase on."""
        return self.runner.nodes_in_use()
