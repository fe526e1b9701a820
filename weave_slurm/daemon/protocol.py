"""weaved's wire protocol: one JSON object per line over a Unix stream socket.

Request:  ``{"op": "submit"|"cancel"|"status"|"groups"|"show"|"sacct"|"ping", ...}``
Reply:    ``{"ok": true, "result": {...}}`` or
          ``{"ok": false, "error": "<error class>", "message": "<one line>"}``

The caller's uid is never part of a message: the daemon reads it from the socket
(SO_PEERCRED). Lines are limited to :data:`MAX_LINE_BYTES`.
"""

from __future__ import annotations

import socket
from enum import StrEnum
from typing import Any

from weave_slurm import wire
from weave_slurm.errors import WeaveError
from weave_slurm.wire import LineTooLong as LineTooLong
from weave_slurm.wire import encode as encode
from weave_slurm.wire import fail as fail
from weave_slurm.wire import ok as ok
from weave_slurm.wire import peer_uid as peer_uid

MAX_LINE_BYTES = 256 * 1024


class Op(StrEnum):
    SUBMIT = "submit"  # spec (TOML text), source -> job id
    CANCEL = "cancel"  # jobs: [ids] -> per-id result
    HOLD = "hold"  # jobs: [ids] -> per-id result (pending jobs: not placed until released)
    RELEASE = "release"  # jobs: [ids] -> per-id result
    UPDATE = "update"  # job, name?, slo?, time? -> what changed (as scontrol update)
    STATUS = "status"  # users?, jobs?, all? -> job rows
    GROUPS = "groups"  # -> group rows
    SHOW = "show"  # kind: job|group, id -> details (owner or admin)
    SACCT = "sacct"  # users?, jobs?, start_s?, end_s? -> usage records (own, or admin: all)
    PING = "ping"  # -> daemon identity


class PermissionDenied(WeaveError):
    """The caller's uid may not act on (or see the details of) this object."""


LOCAL_ERRORS: dict[str, type[WeaveError]] = {"PermissionDenied": PermissionDenied}


def decode_request(line: bytes) -> tuple[Op, dict[str, Any]]:
    return wire.decode_request(line, Op)


def raise_for(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's result, or raise the WeaveError subclass it names."""
    return wire.raise_for(reply, LOCAL_ERRORS)


def read_line(sock: socket.socket, buf: bytearray, limit: int = MAX_LINE_BYTES) -> bytes | None:
    return wire.read_line(sock, buf, limit)
