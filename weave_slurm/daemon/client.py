"""Talking to weaved: one JSON-lines connection (used by weave-sbatch and weave status)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from weave_slurm.daemon import protocol
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import StateError

DEFAULT_STATE_DIR = Path(".state/weaved")
SOCKET_NAME = "weaved.sock"
SOCKET_ENV = "WEAVE_DAEMON_SOCKET"


def default_socket(explicit: Path | None = None) -> Path:
    """``--socket``, else $WEAVE_DAEMON_SOCKET, else .state/weaved/weaved.sock."""
    if explicit is not None:
        return explicit
    env = os.environ.get(SOCKET_ENV)
    return Path(env) if env else DEFAULT_STATE_DIR / SOCKET_NAME


class DaemonClient:
    """One connection to weaved; a context manager."""

    def __init__(self, socket_path: Path, timeout_s: float = 30.0) -> None:
        self.socket_path = socket_path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(socket_path))
        except OSError as exc:
            self._sock.close()
            raise StateError(f"no weaved at {str(socket_path)!r} ({exc.strerror or exc}); "
                             f"start it with 'weave daemon' or set --socket / "
                             f"{SOCKET_ENV}") from exc
        self._buf = bytearray()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        try:
            self._sock.sendall(protocol.encode({"op": op.value, **args}))
            line = protocol.read_line(self._sock, self._buf, limit=1 << 30)
        except OSError as exc:
            raise StateError(f"weaved at {str(self.socket_path)!r}: {exc}") from exc
        if line is None:
            raise StateError(f"weaved at {str(self.socket_path)!r} closed the connection")
        reply = json.loads(line)
        return protocol.raise_for(reply)
