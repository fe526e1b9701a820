"""JSON lines over Unix sockets: the wire both of our socket APIs speak.

weaved's API (:mod:`weave_slurm.daemon.protocol`) and the node daemon's
(:mod:`weave_slurm.node.protocol`) share this framing: one JSON object per line, a
size limit per line, replies ``{"ok": true, "result": {...}}`` or ``{"ok": false,
"error": <WeaveError subclass name>, "message": <one line>}``, and the caller's uid
from the kernel (``SO_PEERCRED``), never from the message.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Self, TypeVar

from weave_slurm import errors
from weave_slurm.errors import ConfigError, StateError, WeaveError

OpT = TypeVar("OpT", bound=StrEnum)

#: Connections a server's listening socket queues before it accepts them. socketserver's
#: default of 5 makes a connect() with a timeout fail at once with EAGAIN on a Unix socket
#: as soon as a few clients arrive together (the ranks of a member, a burst of submissions).
BACKLOG = 256


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


def refuse_long_line(sock: socket.socket, exc: LineTooLong, max_drain_bytes: int = 64 << 20,
                     drain_s: float = 2.0) -> None:
    """Answer an oversized request, then read and drop the rest of it before the caller
    closes: closing with unread input would break the client's pipe before it can read
    the reason. The drain is bounded in bytes and time, so a slow or endless sender
    cannot hold the connection."""
    with contextlib.suppress(OSError):
        sock.sendall(fail(exc))
        sock.settimeout(drain_s)
        drained = 0
        while drained < max_drain_bytes:
            chunk = sock.recv(65536)
            if not chunk or b"\n" in chunk:
                return
            drained += len(chunk)


def decode_request(line: bytes, ops: type[OpT]) -> tuple[OpT, dict[str, Any]]:
    """A request line as (op, arguments); a one-line ConfigError for anything else."""
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"request is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"request must be a JSON object, got {type(raw).__name__}")
    op = raw.pop("op", None)
    try:
        return ops(op), raw
    except ValueError:
        raise ConfigError(f"request op {op!r} is unknown; valid: "
                          f"{', '.join(o.value for o in ops)}") from None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def encode(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def ok(result: Mapping[str, Any]) -> bytes:
    return encode({"ok": True, "result": result})


def failed(exc: BaseException) -> dict[str, Any]:
    """The reply that names ``exc`` (its first line: replies are one line each)."""
    lines = str(exc).strip().splitlines()
    return {"ok": False, "error": type(exc).__name__,
            "message": lines[0] if lines else type(exc).__name__}


def fail(exc: WeaveError) -> bytes:
    return encode(failed(exc))


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


def _connect(sock: socket.socket, path: str, timeout_s: float, wait_s: float = 0.0) -> None:
    """Connect within ``timeout_s``. A Unix socket whose accept queue is full answers
    EAGAIN at once where a blocking connect would wait: the server is busy, not gone.
    A socket that is not there yet (ENOENT) or that nobody listens on (ECONNREFUSED: a
    server restarting) is asked again for ``wait_s``: the server may be starting."""
    start = time.monotonic()
    pause = 0.005
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause > start + timeout_s:
                raise
            time.sleep(pause)
        except (FileNotFoundError, ConnectionRefusedError):
            left_s = start + wait_s - time.monotonic()
            if left_s <= 0:
                raise
            time.sleep(min(pause, left_s))
        pause = min(pause * 2, 0.2)


class LineClient:
    """One connection to a JSON-lines server; usable as a context manager.

    ``server`` names the server in messages ("weaved", "node daemon") and
    ``start_hint`` says how to start it when nobody listens; ``unavailable`` is the
    error raised when nobody listens or the connection breaks. ``wait_s``: how long to
    keep asking a socket that is not there or not listening (a server that is starting)
    before that error; 0 says it at once.
    """

    server = "server"
    start_hint = ""
    unavailable: type[WeaveError] = StateError

    def __init__(self, socket_path: Path, timeout_s: float = 30.0,
                 max_reply_bytes: int = 1 << 30, wait_s: float = 0.0) -> None:
        self.socket_path = Path(socket_path)
        self._limit = max_reply_bytes
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            _connect(self._sock, str(self.socket_path), timeout_s, wait_s)
        except OSError as exc:
            self._sock.close()
            raise self.unavailable(f"no {self.server} at {str(self.socket_path)!r} "
                             f"({exc.strerror or exc}); {self.start_hint}") from exc
        self._buf = bytearray()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def request(self, message: Mapping[str, Any],
                local: Mapping[str, type[WeaveError]] | None = None) -> dict[str, Any]:
        """Send one request; return its result or raise the error it names."""
        where = f"{self.server} at {str(self.socket_path)!r}"
        try:
            try:
                self._sock.sendall(encode(message))
            except (BrokenPipeError, ConnectionResetError):
                # the server may have answered and closed before reading the request (a
                # refused connection says why first): its answer, not the broken pipe
                line = read_line(self._sock, self._buf, self._limit)
                if line is None:
                    raise
            else:
                line = read_line(self._sock, self._buf, self._limit)
        except OSError as exc:
            raise self.unavailable(f"{where}: {exc}") from exc
        if line is None:
            raise self.unavailable(f"{where} closed the connection")
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise StateError(f"{where} sent a reply that is not JSON: {exc}") from exc
        if not isinstance(reply, dict):
            raise StateError(f"{where} sent a reply that is not a JSON object")
        return raise_for(reply, local)
