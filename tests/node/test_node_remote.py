"""The node daemon's network door: munge-authenticated TCP, a MAC on every message."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.munged import private_munged
from tests.harness.processes import run_as
from weave_slurm import wire
from weave_slurm.errors import AuthError, NodeGone, StateError
from weave_slurm.node.auth import Munge, Session, client_hello
from weave_slurm.node.protocol import Op, Request
from weave_slurm.node.remote import (
    ACTIVATE_TIMEOUT_S,
    PURPOSE,
    QUICK_TIMEOUT_S,
    RemoteDoor,
    RemoteNodeClient,
    op_timeout,
)

NOBODY = 65534


@pytest.fixture(scope="module")
def munge_socket() -> Iterator[Path]:
    with private_munged() as sock:
        yield sock


class Door:
    """A door on loopback whose handler records (uid, op, args)."""

    def __init__(self, munge: Munge, trusted: frozenset[int]) -> None:
        self.seen: list[tuple[int, str, dict[str, Any]]] = []
        self.door = RemoteDoor(self.handle, "127.0.0.1", 0, munge, trusted, node="h20-0")
        self.port = int(self.door.address[1])
        ready = threading.Event()
        self.thread = threading.Thread(target=self.door.serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def handle(self, uid: int, request: Request) -> dict[str, Any]:
        self.seen.append((uid, request.op.value, dict(request.args)))
        if request.op is Op.DROP:
            raise StateError("job 'x' is not registered on this node")
        return {"echo": request.args}

    def close(self) -> None:
        self.door.shutdown()
        self.thread.join(5)


@pytest.fixture
def door(munge_socket: Path) -> Iterator[Door]:
    d = Door(Munge(str(munge_socket)), frozenset({0}))
    yield d
    d.close()


def test_a_trusted_caller_is_served_with_the_daemons_authority(door: Door,
                                                               munge_socket: Path) -> None:
    with RemoteNodeClient("127.0.0.1", door.port, Munge(str(munge_socket))) as client:
        assert client.call(Op.STATUS) == {"echo": {}}
        assert client.call(Op.PHASE, job="7") == {"echo": {"job": "7"}}
        with pytest.raises(StateError, match="not registered"):   # typed, over the wire
            client.call(Op.DROP, job="x")
        assert client.call(Op.STATUS) == {"echo": {}}             # the session goes on
    assert [(u, op) for u, op, _ in door.seen] == [(0, "status"), (0, "phase"), (0, "drop"),
                                                   (0, "status")]


def test_another_uid_cannot_impersonate_weaved(door: Door, munge_socket: Path) -> None:
    def as_nobody() -> str:
        try:
            RemoteNodeClient("127.0.0.1", door.port, Munge(str(munge_socket))).call(Op.STATUS)
        except AuthError as exc:
            return f"refused: {exc}"
        return "served"

    out = run_as(NOBODY, as_nobody)
    assert out.startswith("refused: uid 65534 may not control this node daemon"), out
    assert door.seen == []


def _raw_hello(port: int) -> tuple[socket.socket, bytearray, str]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    buf = bytearray()
    line = wire.read_line(sock, buf, 1 << 16)
    assert line is not None
    hello = json.loads(line)
    assert hello["hello"] == PURPOSE and hello["node"] == "h20-0"
    return sock, buf, str(hello["nonce"])


def test_a_replayed_or_foreign_credential_is_refused(door: Door, munge_socket: Path) -> None:
    munge = Munge(str(munge_socket))
    sock, buf, nonce = _raw_hello(door.port)
    cred, _ = client_hello(munge, nonce, PURPOSE)
    sock.sendall(wire.encode({"credential": cred}))
    assert wire.read_line(sock, buf, 1 << 16) is not None       # accepted once
    sock.close()
    sock, buf, _other_nonce = _raw_hello(door.port)
    sock.sendall(wire.encode({"credential": cred}))              # the same credential again
    reply = json.loads(wire.read_line(sock, buf, 1 << 16) or b"{}")
    assert reply["error"] == "AuthError" and "replayed" in reply["message"], reply
    sock, buf, nonce = _raw_hello(door.port)
    stale, _ = client_hello(munge, "00" * 16, PURPOSE)           # made for another nonce
    sock.sendall(wire.encode({"credential": stale}))
    reply = json.loads(wire.read_line(sock, buf, 1 << 16) or b"{}")
    assert reply["error"] == "AuthError" and "another connection's nonce" in reply["message"]
    sock, buf, nonce = _raw_hello(door.port)
    other, _ = client_hello(munge, nonce, "something-else")
    sock.sendall(wire.encode({"credential": other}))
    reply = json.loads(wire.read_line(sock, buf, 1 << 16) or b"{}")
    assert reply["error"] == "AuthError" and "not 'weave-node'" in reply["message"]
    assert door.seen == []


def test_an_unsigned_or_tampered_request_ends_the_connection(door: Door,
                                                             munge_socket: Path) -> None:
    munge = Munge(str(munge_socket))
    sock, buf, nonce = _raw_hello(door.port)
    cred, session = client_hello(munge, nonce, PURPOSE)
    sock.sendall(wire.encode({"credential": cred}))
    session.open(wire.read_line(sock, buf, 1 << 16) or b"")
    good = session.seal({"op": "status"})
    seq, mac, body = good.decode().split(" ", 2)
    sock.sendall(f"{seq} {mac} {body.replace('status', 'drop')}".encode())   # same MAC
    assert wire.read_line(sock, buf, 1 << 16) is None            # dropped, nothing served
    sock.close()
    sock, buf, nonce = _raw_hello(door.port)
    cred, session = client_hello(munge, nonce, PURPOSE)
    sock.sendall(wire.encode({"credential": cred}))
    session.open(wire.read_line(sock, buf, 1 << 16) or b"")
    sock.sendall(wire.encode({"op": "status"}))                  # no MAC at all
    assert wire.read_line(sock, buf, 1 << 16) is None
    assert door.seen == []


def test_a_session_refuses_replayed_and_reordered_lines() -> None:
    a, b = Session(b"k" * 32), Session(b"k" * 32)
    first, second = a.seal({"n": 1}), a.seal({"n": 2})
    with pytest.raises(AuthError, match="out of order"):
        b.open(second)
    assert b.open(first) == {"n": 1}
    with pytest.raises(AuthError, match="out of order"):
        b.open(first)
    with pytest.raises(AuthError, match="bad MAC"):
        Session(b"x" * 32).open(first)


def test_nobody_listening_is_node_gone() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(NodeGone, match=f"no node daemon at 127.0.0.1:{port}"):
        RemoteNodeClient("127.0.0.1", port, timeout_s=2)


def test_a_node_daemon_serves_weaved_over_its_door(shm_root: Path, ckpt_root: Path,
                                                   munge_socket: Path) -> None:
    import torch

    from weave_slurm.node.daemon import NodeConfig, NodeDaemon
    from weave_slurm.node.node_client import NodeClient

    daemon = NodeDaemon(NodeConfig(host_mem_gib=16 / 1024, root=shm_root,
                                   checkpoint_root=ckpt_root, checkpoint_interval_s=0,
                                   resident_workers=False, listen_port=0,
                                   listen_host="127.0.0.1", munge_socket=str(munge_socket),
                                   node_name="h800-0"))
    daemon.start()
    assert daemon.door is not None
    port = int(daemon.door.address[1])
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with RemoteNodeClient("127.0.0.1", port, Munge(str(munge_socket))) as weaved:
            assert weaved.call(Op.REGISTER, job="5", uid=NOBODY)["uid"] == NOBODY
            with NodeClient(daemon.config.socket) as local:   # the job's own data path
                local.put_state(weaved_job(), "weights", {"w": torch.ones(4)}, version=3)
            assert weaved.call(Op.DIGEST, job="5", name="weights")["version"] == 3
            assert weaved.call(Op.COPY, job="5", name="weights",
                               as_name="weights.b1")["version"] == 3
            segs = weaved.call(Op.ATTACH_INFO, job="5")["segments"]
            assert sorted(segs) == ["weights", "weights.b1"]
            weaved.call(Op.DROP, job="5")
        out = run_as(NOBODY, lambda: _try_status(port, munge_socket))
        assert out.startswith("refused: uid 65534 may not control"), out
    finally:
        daemon.shutdown()
        thread.join(10)


def weaved_job() -> object:
    from weave_slurm.node.index import JobRef

    return JobRef("5", NOBODY)


def _try_status(port: int, munge_socket: Path) -> str:
    try:
        RemoteNodeClient("127.0.0.1", port, Munge(str(munge_socket))).call(Op.STATUS)
    except AuthError as exc:
        return f"refused: {exc}"
    return "served"


def test_an_activation_may_wait_for_its_zygote_longer_than_a_quick_op() -> None:
    # a quick op is held to 15 s; an activation waits for a zygote's torch import (a
    # minute at most: a node lost mid-activation is still found); a slow op gets it all
    assert op_timeout(Op.STATUS, 120) == QUICK_TIMEOUT_S
    assert QUICK_TIMEOUT_S < op_timeout(Op.ACTIVATE, 120) == ACTIVATE_TIMEOUT_S < 120
    assert op_timeout(Op.CHECKPOINT, 120) == 120
    assert op_timeout(Op.ACTIVATE, 2) == op_timeout(Op.STATUS, 2) == 2
