"""The node daemon's network door: weaved (and peer node daemons) over TCP, munge-signed.

weaved runs on a login or service node; a node daemon runs on a compute node. They
talk over TCP at the node's address (Slurm's ``NodeAddr``) and a port weaved gives the
allocation. Every connection is authenticated with munge and every message carries
a MAC (:mod:`weave_slurm.node.auth`); a caller whose munge uid is not trusted
(weaved's, and root's for peer node daemons) is refused before any request is read.
A trusted caller acts with the daemon's own authority (as root does on the local
socket), because weaved is what registers jobs for their owners.

Users on the node reach their own jobs through the node-local Unix socket
(``SO_PEERCRED``), never through this door.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
from typing import Any, Self

from weave_slurm import wire
from weave_slurm.errors import AuthError, NodeGone, StateError, WeaveError
from weave_slurm.node.auth import Munge, Session, client_hello, new_nonce, server_accept
from weave_slurm.node.protocol import MAX_LINE_BYTES, Handle, Op, Request, answer

log = logging.getLogger(__name__)

PURPOSE = "weave-node"     # what a credential is for (a credential for anything else fails)
#: The line a node daemon prints on its stdout once its door listens (weaved reads the
#: newest one per node from the step's output, which Slurm brings back to its host):
#: ``weave-node-ready {"node": ..., "port": ..., "pid": ...}``.
READY_LINE = "weave-node-ready"
PRIVILEGED_UID = 0         # how a trusted remote caller is treated by the handlers
#: A host on the site's network answers a connection in milliseconds; one that does not
#: within this is unreachable (its link is down), not slow.
CONNECT_TIMEOUT_S = 5.0
#: How long one request may take: most answer in milliseconds; these move or check a
#: job's whole state on disk and may take minutes.
QUICK_TIMEOUT_S = 15.0
SLOW_OPS = frozenset({Op.CHECKPOINT, Op.RESTORE, Op.ADOPT, Op.DROP, Op.COPY, Op.DIGEST})
#: An activation waits for its resident worker, and on a new node daemon for the zygote
#: that forks it to import torch first: over 15 s on a loaded node, and longer from a
#: slow shared file system (seen in the chaos test under load: the first phase of every
#: member failed at 15 s). Not a slow op's minutes: a node lost mid-activation is still
#: found within a minute.
ACTIVATE_TIMEOUT_S = 60.0


def op_timeout(op: Op, timeout_s: float) -> float:
    """How long a request ``op`` may take, at most ``timeout_s``."""
    if op in SLOW_OPS:
        return timeout_s
    return min(timeout_s, ACTIVATE_TIMEOUT_S if op is Op.ACTIVATE else QUICK_TIMEOUT_S)


def ready_line(node: str, port: int) -> str:
    return f"{READY_LINE} {json.dumps({'node': node, 'port': port, 'pid': os.getpid()})}"


def ready_ports(text: str) -> dict[str, int]:
    """The newest port each node's daemon said it listens on, from a step's output."""
    ports: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(READY_LINE + " "):
            continue
        try:
            said = json.loads(line[len(READY_LINE) + 1:])
            ports[str(said["node"])] = int(said["port"])
        except (ValueError, KeyError, TypeError):
            continue
    return ports


class RemoteDoor:
    """A threaded TCP server in front of a node daemon's request handler."""

    def __init__(self, handle: Handle, host: str, port: int, munge: Munge,
                 trusted_uids: frozenset[int], node: str = "") -> None:
        self.handle, self.munge, self.trusted, self.node = handle, munge, trusted_uids, node
        door = self

        class _Conn(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                door._serve(self.request, self.client_address)

        class _Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            request_queue_size = wire.BACKLOG

        try:
            self._server = _Server((host, port), _Conn)
        except OSError as exc:
            raise StateError(f"node daemon: cannot listen on {host or '*'}:{port} "
                             f"({exc.strerror or exc}); is another daemon using the "
                             "port?") from None
        self.address = self._server.server_address[:2]

    def serve(self, ready: threading.Event | None = None) -> None:
        if ready is not None:
            ready.set()
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self._server.server_close()

    def shutdown(self) -> None:
        self._server.shutdown()

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        buf = bytearray()
        nonce = new_nonce()
        try:
            sock.sendall(wire.encode({"hello": PURPOSE, "nonce": nonce, "node": self.node}))
            line = wire.read_line(sock, buf, 1 << 16)
            if line is None:
                return
            cred = json.loads(line).get("credential")
            uid, session = server_accept(self.munge, nonce, str(cred), PURPOSE, self.trusted)
        except (AuthError, ValueError, AttributeError, OSError) as exc:
            log.warning("refused a connection from %s: %s", peer, exc)
            err = exc if isinstance(exc, WeaveError) else AuthError(f"bad hello: {exc}")
            with contextlib.suppress(OSError):
                sock.sendall(wire.fail(err))
            return
        sock.sendall(session.seal({"ok": True, "result": {"uid": uid}}))
        log.info("weaved (uid %d) connected from %s", uid, peer)
        self._requests(sock, buf, session)

    def _requests(self, sock: socket.socket, buf: bytearray, session: Session) -> None:
        while True:
            try:
                line = wire.read_line(sock, buf, MAX_LINE_BYTES)
            except (wire.LineTooLong, OSError):
                return
            if line is None:
                return
            try:
                request = Request.decode(json.dumps(session.open(line)).encode())
            except AuthError as exc:
                log.warning("connection dropped: %s", exc)
                return
            except WeaveError as exc:
                sock.sendall(session.seal(wire.failed(exc)))
                continue
            try:
                sock.sendall(session.seal(answer(self.handle, PRIVILEGED_UID, request)))
            except OSError:
                return


class RemoteNodeClient:
    """One authenticated connection to a node daemon's network door."""

    server = "node daemon"

    def __init__(self, host: str, port: int, munge: Munge | None = None,
                 timeout_s: float = 120.0) -> None:
        """``timeout_s``: the longest any request may take (most are held to less:
        :func:`op_timeout`); connecting is held to :data:`CONNECT_TIMEOUT_S`."""
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.where = f"node daemon at {host}:{port}"
        munge = munge or Munge()
        self._buf = bytearray()
        try:
            self._sock = socket.create_connection(
                (host, port), timeout=min(timeout_s, CONNECT_TIMEOUT_S))
        except OSError as exc:
            raise NodeGone(f"no {self.where} ({exc.strerror or exc})") from None
        self._sock.settimeout(min(timeout_s, QUICK_TIMEOUT_S))
        try:
            hello = json.loads(self._read_raw())
            cred, self._session = client_hello(munge, str(hello["nonce"]), PURPOSE)
            self._sock.sendall(wire.encode({"credential": cred}))
            first = self._read_raw()
            if not first.startswith(b"0 "):
                wire.raise_for(json.loads(first))   # the door refused us: its reason
            self._session.open(first)
        except BaseException:
            self._sock.close()
            raise

    def _read_raw(self) -> bytes:
        try:
            line = wire.read_line(self._sock, self._buf, MAX_LINE_BYTES)
        except OSError as exc:
            raise NodeGone(f"{self.where}: {exc}") from None
        if line is None:
            raise NodeGone(f"{self.where} closed the connection")
        return line

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        """Send one request; its result or the error it names (``NodeGone`` when the
        daemon does not answer in time: a node cut off the network never will)."""
        self._sock.settimeout(op_timeout(op, self.timeout_s))
        try:
            self._sock.sendall(self._session.seal({"op": op.value, **args}))
        except OSError as exc:
            raise NodeGone(f"{self.where}: {exc}") from None
        return wire.raise_for(self._session.open(self._read_raw()))

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
