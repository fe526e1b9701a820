"""The phase gate: how a cooperative job's own processes take their turns in a group.

A cooperative job (a ``[launch]`` table in its spec, docs/job_api.md) runs its own
pipeline (TRL, verl, OpenRLHF, ROLL, a plain script). At each phase boundary it asks
weave for its turn and blocks until the group runtime grants it::

    from weave_slurm import gate

    gate.on_switch_out(lambda turn: engine.sleep(level=1))   # offload: the turn ends
    gate.on_switch_in(lambda turn: engine.wake_up())         # reload: the turn starts
    for v in range(steps):
        with gate.phase("rollout", version=v) as turn:       # the weights it consumes
            batch = generate(...)
            turn.report(reward_mean=...)

The training process does the same with ``gate.phase("train", version=v)`` (the
trajectories of version ``v`` it consumes; it produces ``v + 1``). weave enforces the
on-policy barrier on these versions: a train at a version without the matching
rollout, or a rollout at a version the job's weights are not at, raises
:class:`~weave_slurm.errors.GateRefused` here, with the reason in one line. A phase held
past its deadline counts as hung; weave then revokes it (``done`` raises
:class:`~weave_slurm.errors.PhaseRevoked`) and stops the job's processes.

The gate reaches weave through the node daemon's node-local socket
(``WEAVE_NODE_SOCKET``, set by weave for a launched process and by the SPANK plugin for
a step's tasks); the daemon learns the caller's uid from the kernel (SO_PEERCRED), so a
process can only gate its own uid's jobs. ``WEAVE_JOB_ID`` names the job. This module
imports neither torch nor anything of weave that does; nothing is read at import time.

**Outside weave** (neither variable set: the script run by hand, or by another
scheduler) the gate passes through (:class:`PassThrough`): each phase is granted at
once, nothing is enforced or reported, and the switch hooks run as they do under
weave, so one script runs the same path with and without weave. Only one of the two
set, or a socket nobody answers at, is a fault, not "outside weave": it raises.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from weave_slurm.errors import ConfigError, GateRefused, PhaseRevoked, StateError
from weave_slurm.wire import LineClient

__all__ = ["Gate", "GateRefused", "PassThrough", "PhaseRevoked", "Turn", "connect",
           "on_switch_in", "on_switch_out", "phase"]

#: One ``wait`` request blocks at most this long; the gate then asks again.
WAIT_SLICE_S = 5.0
_PHASES = ("rollout", "train")

Hook = Callable[["Turn"], None]


class _NodeLine(LineClient):
    server = "node daemon"
    start_hint = "is this process running in a weave job's allocation?"


@dataclass
class Turn:
    """One granted phase: what the job reports about it."""

    phase: str
    version: int                      # the version it consumes (rollout: weights; train: batch)
    activation: int
    step: int
    granted_s: float                  # time.monotonic() at the grant
    metrics: dict[str, float] = field(default_factory=dict)
    produced: int | None = None       # train: the version it produced (default version + 1)

    def report(self, **metrics: float) -> None:
        """Scalar metrics of this phase (``reward_mean`` shows in ``weave status``)."""
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"gate: metric {key!r} = {value!r}: must be a number")
            self.metrics[key] = float(value)


class Gate:
    """A job's connection to its node daemon's gate (one per process)."""

    def __init__(self, socket_path: Path, job_id: str) -> None:
        self.socket_path = Path(socket_path)
        self.job_id = job_id
        self.switch_in: list[Hook] = []
        self.switch_out: list[Hook] = []

    def _call(self, **args: object) -> dict[str, object]:
        with _NodeLine(self.socket_path, timeout_s=WAIT_SLICE_S + 30.0) as line:
            return line.request({"op": "gate", "job": self.job_id, **args})

    def acquire(self, phase: str, version: int) -> Turn:
        """Block until weave grants ``phase`` at ``version`` (or refuses it)."""
        _check(phase, version)
        while True:
            reply = self._call(action="wait", phase=phase, version=version,
                               timeout_s=WAIT_SLICE_S)
            if reply.get("granted"):
                return Turn(phase, version, _as_int(reply, "activation"),
                            _as_int(reply, "step"), time.monotonic())

    def release(self, turn: Turn) -> dict[str, object]:
        """Hand the turn back (the phase ended); raises PhaseRevoked if weave took it."""
        args: dict[str, object] = {"action": "done", "activation": turn.activation,
                                   "metrics": turn.metrics}
        if turn.produced is not None:
            args["produced"] = turn.produced
        return self._call(**args)

    @contextmanager
    def phase(self, phase: str, version: int) -> Iterator[Turn]:
        """``with gate.phase("rollout", version=v) as turn:``: the body is the phase."""
        turn = self.acquire(phase, version)
        try:
            for hook in self.switch_in:
                hook(turn)
            yield turn
            for hook in self.switch_out:
                hook(turn)
        except BaseException as exc:   # the phase failed: weave is told why, in one line
            self.fail(turn, f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
            raise
        self.release(turn)

    def fail(self, turn: Turn, why: str) -> None:
        """The phase failed (the ``with`` body raised): weave fails the job with ``why``."""
        with contextlib.suppress(StateError):   # revoked already, or the node is gone
            self._call(action="done", activation=turn.activation, error=why)


class PassThrough(Gate):
    """The gate of a process outside weave (module doc): every phase at once."""

    def __init__(self) -> None:   # no node daemon, no job: nothing is ever asked
        self.switch_in: list[Hook] = []
        self.switch_out: list[Hook] = []

    def _call(self, **args: object) -> dict[str, object]:
        raise StateError("gate: outside weave there is no node daemon to ask")

    def acquire(self, phase: str, version: int) -> Turn:
        _check(phase, version)
        return Turn(phase, version, 0, version, time.monotonic())

    def release(self, turn: Turn) -> dict[str, object]:
        return {}

    def fail(self, turn: Turn, why: str) -> None:
        pass


def _check(phase: str, version: int) -> None:
    if phase not in _PHASES:
        raise ConfigError(f"gate.phase: phase {phase!r}; valid: {', '.join(_PHASES)}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"gate.phase: version {version!r}; must be an integer >= 0")


def _as_int(reply: Mapping[str, object], key: str) -> int:
    value = reply.get(key)
    if not isinstance(value, int):
        raise StateError(f"gate: the node daemon's grant has no integer {key!r}")
    return value


_default: Gate | None = None


def connect(socket_path: str | Path | None = None, job_id: str | None = None) -> Gate:
    """The process's gate (``WEAVE_NODE_SOCKET``, ``WEAVE_JOB_ID`` unless given); with
    neither given nor set, a :class:`PassThrough` (outside weave)."""
    global _default
    if _default is not None and socket_path is None and job_id is None:
        return _default
    sock = socket_path or os.environ.get("WEAVE_NODE_SOCKET")
    job = job_id or os.environ.get("WEAVE_JOB_ID")
    gate: Gate
    if not sock and not job and socket_path is None and job_id is None:
        gate = PassThrough()
    elif not sock or not job:
        have, lack = (("WEAVE_NODE_SOCKET", "WEAVE_JOB_ID") if sock
                      else ("WEAVE_JOB_ID", "WEAVE_NODE_SOCKET"))
        raise ConfigError(f"gate: {have} is set (or given) but {lack} is not: a weave "
                          "cooperative job's processes get both (a [launch] table or "
                          "'#WEAVE --cooperative'); unset both to run outside weave, or "
                          "pass socket_path and job_id")
    else:
        gate = Gate(Path(sock), job)
    if socket_path is None and job_id is None:
        _default = gate
    return gate


def phase(phase: str, version: int) -> AbstractContextManager[Turn]:
    """``with gate.phase("train", version=v) as turn:`` on the process's gate."""
    return connect().phase(phase, version)


def on_switch_in(hook: Hook) -> Hook:
    """Run ``hook(turn)`` when a turn starts, before the body (reload the job's state)."""
    connect().switch_in.append(hook)
    return hook


def on_switch_out(hook: Hook) -> Hook:
    """Run ``hook(turn)`` when the body ended, before the turn goes back (offload)."""
    connect().switch_out.append(hook)
    return hook
