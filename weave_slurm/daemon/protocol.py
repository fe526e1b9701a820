"""weaved's wire protocol: one JSON object per line over a Unix stream socket.

Request:  ``{"op": "submit"|"cancel"|"status"|"groups"|"show"|"ping", ...arguments}``
Reply:    ``{"ok": true, "result": {...}}`` or
          ``{"ok": false, "error": "<error class>", "message": "<one line>"}``

The caller's uid is never part of a message: the daemon reads it from the socket
(SO_PEERCRED). Lines are limited to :data:`MAX_LINE_BYTES`.
"""

from __future__ import annotations

import json
import socket
from enum import StrEnum
from typing import Any

from weave_slurm import wire
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.wire import LineTooLong as LineTooLong
from weave_slurm.wire import encode as encode
from weave_slurm.wire import fail as fail
from weave_slurm.wire import ok as ok
from weave_slurm.wire import peer_uid as peer_uid

MAX_LINE_BYTES = 256 * 1024


class Op(StrEnum):
    SUBMIT = "submit"  # spec (TOML text), source -> job id
    CANCEL = "cancel"  # jobs: [ids] -> per-id result
    STATUS = "status"  # users?, jobs?, all? -> job rows
    GROUPS = "groups"  # -> group rows
    SHOW = "show"  # kind: job|group, id -> details (owner or admin)
    PING = "ping"  # -> daemon identity


class PermissionDenied(WeaveError):
    """The caller's uid may not act on (or see the details of) this object."""


LOCAL_ERRORS: dict[str, type[WeaveError]] = {"PermissionDenied": PermissionDenied}


def decode_request(line: bytes) -> tuple[Op, dict[str, Any]]:
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"request is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"request must be a JSON object, got {type(raw).__name__}")
    op = raw.pop("op", None)
    try:
        return Op(op), raw
    except ValueError:
        raise ConfigError(f"request op {op!r} is unknown; valid: "
                          f"{', '.join(o.value for o in Op)}") from None


def raise_for(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's result, or raise the WeaveError subclass it names."""
    return wire.raise_for(reply, LOCAL_ERRORS)


def read_line(sock: socket.socket, buf: bytearray, limit: int = MAX_LINE_BYTES) -> bytes | None:
    return wire.read_line(sock, buf, limit)
