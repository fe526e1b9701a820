"""Messages between a node daemon, its zygote and resident workers: one JSON object per
``SOCK_SEQPACKET`` datagram, optionally with file descriptors (``SCM_RIGHTS``)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

MAX_MSG_BYTES = 1 << 16


def send(sock: socket.socket, body: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message (and optional fds) on a SOCK_SEQPACKET socket."""
    data = json.dumps(body).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds that came with it; (None, []) at end of stream."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MSG_BYTES, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    body = json.loads(data)
    return (body if isinstance(body, dict) else {}), list(fds)
