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
import struct
from enum import StrEnum
from typing import Any

from weave_slurm import errors
from weave_slurm.errors import ConfigError, WeaveError

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


class LineTooLong(WeaveError):
    """A request line exceeded the size limit."""


_LOCAL_ERRORS: dict[str, type[WeaveError]] = {"PermissionDenied": PermissionDenied,
                                              "LineTooLong": LineTooLong}


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


def encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def ok(result: dict[str, Any]) -> bytes:
    return encode({"ok": True, "result": result})


def fail(exc: WeaveError) -> bytes:
    return encode({"ok": False, "error": type(exc).__name__,
                   "message": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})


def raise_for(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's result, or raise the WeaveError subclass it names."""
    if reply.get("ok"):
        result = reply.get("result")
        return result if isinstance(result, dict) else {}
    name = str(reply.get("error"))
    cls = _LOCAL_ERRORS.get(name) or getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, WeaveError)) or \
            cls is errors.ExternalCommandError:
        cls = WeaveError
    raise cls(str(reply.get("message")))


def read_line(sock: socket.socket, buf: bytearray, limit: int = MAX_LINE_BYTES) -> bytes | None:
    """One line without its newline; None at end of stream; LineTooLong past ``limit``."""
    while b"\n" not in buf:
        if len(buf) > limit:
            raise LineTooLong(f"request line longer than {limit} bytes; refused")
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf.extend(chunk)
    line, _, rest = bytes(buf).partition(b"\n")
    if len(line) > limit:
        raise LineTooLong(f"request line longer than {limit} bytes; refused")
    buf[:] = rest
    return line


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
