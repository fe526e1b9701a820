"""JSON lines over Unix sockets: the wire both of our socket APIs speak.

weaved's API (:mod:`weave_slurm.daemon.protocol`) and the node daemon's
(:mod:`weave_slurm.node.protocol`) share this framing: one JSON object per line, a
size limit per line, replies ``{"ok": true, "result": {...}}`` or ``{"ok": false,
"error": <WeaveError subclass name>, "message": <one line>}``, and the caller's uid
from the kernel (``SO_PEERCRED``), never from the message.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

from weave_slurm import errors
from weave_slurm.errors import ConfigError, WeaveError


class LineTooLong(ConfigError):
    """A request line exceeded the size limit."""


def read_line(sock: socket.socket, buf: bytearray, limit: int) -> bytes | None:
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
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def encode(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def ok(result: Mapping[str, Any]) -> bytes:
    return encode({"ok": True, "result": result})


def fail(exc: WeaveError) -> bytes:
    text = str(exc)
    return encode({"ok": False, "error": type(exc).__name__,
                   "message": text.splitlines()[0] if text else type(exc).__name__})


def raise_for(reply: Mapping[str, Any],
              local: Mapping[str, type[WeaveError]] | None = None) -> dict[str, Any]:
    """A reply's result, or raise the WeaveError subclass it names (else WeaveError)."""
    if reply.get("ok"):
        result = reply.get("result")
        return result if isinstance(result, dict) else {}
    name = str(reply.get("error"))
    cls = (local or {}).get(name) or {"LineTooLong": LineTooLong}.get(name) \
        or getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, WeaveError)) or \
            cls is errors.ExternalCommandError:
        cls = WeaveError
    raise cls(str(reply.get("message")))
