"""The Unix-socket server: a thread per connection, size-limited lines, timeouts.

A connection that sends nothing for ``client_timeout_s`` is closed, so a slow or
stuck client holds one thread for at most that long and never the reconcile
loop. At most ``max_clients`` connections are served at once, and at most
``max_per_uid`` of one user's (read from ``SO_PEERCRED`` before anything else; root
only counts against the total), so no user can starve the others by holding
connections; more are answered with one error line and closed. The socket file is
made mode 0666: every local user may talk to the daemon, which authorises each request
by the peer's uid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
from collections import Counter
from pathlib import Path

from weave_slurm import wire
from weave_slurm.daemon import protocol
from weave_slurm.daemon.api import Api
from weave_slurm.errors import ServerBusy, WeaveError

log = logging.getLogger(__name__)


class _Handler(socketserver.BaseRequestHandler):
    server: ApiServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        srv = self.server
        try:
            uid = protocol.peer_uid(sock)
        except OSError:
            return
        refusal = srv.admit(uid)
        if refusal is not None:
            with contextlib.suppress(OSError):
                sock.sendall(protocol.fail(ServerBusy(refusal)))   # a client may retry
            return
        try:
            sock.settimeout(srv.client_timeout_s)
            buf = bytearray()
            while True:
                try:
                    line = protocol.read_line(sock, buf, srv.max_line_bytes)
                except protocol.LineTooLong as exc:
                    wire.refuse_long_line(sock, exc)
                    return
                if line is None:
                    return
                sock.sendall(self._answer(line, uid))
        except (TimeoutError, OSError):
            return
        finally:
            srv.leave(uid)

    def _answer(self, line: bytes, uid: int) -> bytes:
        try:
            op, args = protocol.decode_request(line)
            return protocol.ok(self.server.api.handle(op, args, uid))
        except WeaveError as exc:
            return protocol.fail(exc)
        except Exception as exc:  # a bug must not kill the connection thread silently
            log.exception("request failed")
            return protocol.fail(WeaveError(f"internal error: {type(exc).__name__}: {exc}"))


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = wire.BACKLOG

    def __init__(self, path: Path, api: Api, *, client_timeout_s: float = 10.0,
                 max_line_bytes: int = protocol.MAX_LINE_BYTES, max_clients: int = 256,
                 max_per_uid: int = 16) -> None:
        self.api = api
        self.client_timeout_s = client_timeout_s
        self.max_line_bytes = max_line_bytes
        self.max_clients, self.max_per_uid = max_clients, max_per_uid
        self._held: Counter[int] = Counter()      # uid -> connections being served
        self._held_lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)
        self.path = path

    def admit(self, uid: int) -> str | None:
        """Take a slot for ``uid``'s connection; why not, in words, if none is left."""
        with self._held_lock:   # root (the admin) is held only to the global limit
            if uid != 0 and self._held[uid] >= self.max_per_uid:
                return (f"uid {uid} already has {self._held[uid]} connections to weaved "
                        f"(at most {self.max_per_uid} per user); close one and retry")
            if sum(self._held.values()) >= self.max_clients:
                return f"weaved is serving {self.max_clients} clients; retry shortly"
            self._held[uid] += 1
            return None

    def leave(self, uid: int) -> None:
        with self._held_lock:
            self._held[uid] -= 1
            if self._held[uid] <= 0:
                del self._held[uid]

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(OSError):
            self.path.unlink()
