"""The JSON-lines client against a real Unix socket whose server is slow to accept."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from weave_slurm.errors import StateError
from weave_slurm.wire import LineClient, encode, read_line


def _full_listener(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listener with a backlog of 1 that accepts nothing, and the callers queued on it
    until the next connect is refused with EAGAIN (the queue is full)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    queued: list[socket.socket] = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:
            s.close()
            return server, queued
        queued.append(s)


def test_a_caller_waits_for_a_server_whose_accept_queue_is_full(tmp_path: Path) -> None:
    path = tmp_path / "busy.sock"
    server, queued = _full_listener(path)

    def serve() -> None:   # busy for a while, then accepts everyone and answers one line
        for _ in range(len(queued) + 1):
            conn, _ = server.accept()
            buf = bytearray()
            if read_line(conn, buf, 1 << 16) is not None:
                conn.sendall(encode({"ok": True, "result": {"served": True}}))
            conn.close()

    for s in queued:
        s.close()
    timer = threading.Timer(0.3, serve)
    timer.start()
    try:
        with LineClient(path, timeout_s=10) as client:
            assert client.request({"op": "status"}) == {"served": True}
    finally:
        timer.join(10)
        server.close()


def test_a_full_queue_past_the_timeout_is_unavailable_in_words(tmp_path: Path) -> None:
    path = tmp_path / "stuck.sock"
    server, queued = _full_listener(path)
    try:
        with pytest.raises(StateError, match=r"no server at .*stuck.sock.*temporarily"):
            LineClient(path, timeout_s=0.2)
    finally:
        for s in queued:
            s.close()
        server.close()


def test_a_refusal_sent_before_the_server_closed_is_what_the_caller_reads(
        tmp_path: Path) -> None:
    """A server that refuses a connection says why and closes without reading the
    request (weaved past a user's connections): the caller's write then breaks the pipe,
    and the caller reports the server's words, not 'Broken pipe'."""
    path = tmp_path / "refusing.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    said = threading.Event()

    def refuse() -> None:
        conn, _ = server.accept()
        conn.sendall(encode({"ok": False, "error": "StateError",
                             "message": "at most 16 per user; close one and retry"}))
        conn.close()
        said.set()

    thread = threading.Thread(target=refuse)
    thread.start()
    try:
        with LineClient(path, timeout_s=10) as client:
            said.wait(10)
            with pytest.raises(StateError, match="at most 16 per user"):
                client.request({"op": "submit", "spec": "x" * (1 << 22)})   # > the buffer
    finally:
        thread.join(10)
        server.close()
