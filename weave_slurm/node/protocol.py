"""The node daemon's wire protocol: one JSON object per line over a Unix socket.

Request:  ``{"op": "<op>", "job": "<job id>", ...arguments}``
Reply:    ``{"ok": true, "result": {...}}`` or
          ``{"ok": false, "error": "<WeaveError subclass>", "message": "<one line>"}``

The caller's uid is not part of the message: the daemon reads it from the socket
(SO_PEERCRED). Only the uid that registered a job, or root, may touch it.

The values the replies carry (:class:`WorkerState`, :class:`WorkerStatus`) live here
too, so that weaved and the group runtime read them without importing the node side
(its segments map shared memory through torch).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from weave_slurm import wire
from weave_slurm.errors import ConfigError, StateError, WeaveError
from weave_slurm.vocab import Phase
from weave_slurm.wire import fail as fail
from weave_slurm.wire import ok as ok
from weave_slurm.wire import peer_uid as peer_uid
from weave_slurm.wire import raise_for as raise_for

MAX_LINE_BYTES = 1 << 20

log = logging.getLogger(__name__)


class Op(StrEnum):
    """Every request the node daemon answers."""

    REGISTER = "register"        # job -> owner = caller's uid
    PUT = "put"                  # job, name, nbytes -> staged files to write (budget charged)
    COMMIT = "commit"            # job, name, token -> staged files validated, renamed in place
    ABORT = "abort"              # job, name, token -> staged files removed, charge undone
    ATTACH_INFO = "attach_info"  # job -> segment paths and indexes
    COPY = "copy"                # job, name, as_name -> a checked copy on this node
    DIGEST = "digest"            # job, name -> SHA-256 of the segment's tensors
    ACTIVATE = "activate"        # job, phase, argv, env -> worker pid and paths
    DEACTIVATE = "deactivate"    # job -> worker stopped
    PHASE = "phase"              # job -> worker state (running / exited / killed)
    CHECKPOINT = "checkpoint"    # job -> checkpoint written
    RESTORE = "restore"          # job -> newest checkpoint copied into shm
    DROP = "drop"                # job -> worker stopped, state and checkpoints removed
    ADOPT = "adopt"              # job, from_root (root only) -> the newest checkpoint of
                                 # the job under another node's root, copied in
    STATUS = "status"            # -> memory, jobs, versions
    GATE = "gate"                # job, action (wait/done: the job's process; refuse:
                                 # weaved) -> a cooperative job's phase gate (gate_ops)
    LAUNCH = "launch"            # job, role, command, env (weaved) -> the job's process
    LEAVE = "leave"              # (weaved) its node is given back: state dropped, it ends


@dataclass(frozen=True)
class Request:
    op: Op
    args: dict[str, Any]

    def job_id(self) -> str:
        job = self.args.get("job")
        if not isinstance(job, str):
            raise ConfigError(f"request {self.op.value!r}: field 'job' is missing or not a "
                              f"string (got {job!r})")
        return job

    def encode(self) -> bytes:
        return wire.encode({"op": self.op.value, **self.args})

    @classmethod
    def decode(cls, line: bytes) -> Request:
        op, args = wire.decode_request(line, Op)
        return cls(op, args)


class WorkerState(StrEnum):
    """How a phase worker stands, as the ``phase`` reply's ``worker.state`` says."""

    RUNNING = "running"
    EXITED = "exited"      # returncode 0
    FAILED = "failed"      # returncode > 0
    KILLED = "killed"      # ended by a signal (returncode < 0)


@dataclass(frozen=True)
class WorkerStatus:
    """One phase worker's status, as the ``activate``, ``phase`` and ``deactivate``
    replies carry it."""

    job_id: str
    phase: Phase
    pid: int
    state: WorkerState
    returncode: int | None
    started_s: float
    log_path: str

    def to_json(self) -> dict[str, object]:
        return {"job": self.job_id, "phase": self.phase.value, "pid": self.pid,
                "state": self.state.value, "returncode": self.returncode,
                "started_s": self.started_s, "log_path": self.log_path}


def read_line(sock: socket.socket, buf: bytearray, limit: int = MAX_LINE_BYTES) -> bytes | None:
    return wire.read_line(sock, buf, limit)


Handle = Callable[[int, Request], dict[str, Any]]


def answer(handle: Handle, uid: int, request: Request) -> dict[str, Any]:
    """The reply to one request from ``uid`` (at either door of the daemon): its result,
    the refusal in words, or an internal error (a bug must not drop the connection: the
    caller would take the daemon for gone)."""
    try:
        return {"ok": True, "result": handle(uid, request)}
    except WeaveError as exc:
        return wire.failed(exc)
    except PermissionError as exc:
        return wire.failed(StateError(f"permission denied: {exc}"))
    except Exception as exc:
        log.exception("node daemon: a %s request failed", request.op.value)
        return wire.failed(StateError(f"internal error: {type(exc).__name__}: {exc}"))
