"""Talking to weaved: one JSON-lines connection (used by weave-sbatch and weave status)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from weave_slurm.daemon import protocol
from weave_slurm.daemon.protocol import Op
from weave_slurm.wire import LineClient

DEFAULT_STATE_DIR = Path(".state/weaved")
SOCKET_NAME = "weaved.sock"
SOCKET_ENV = "WEAVE_DAEMON_SOCKET"


def default_socket(explicit: Path | None = None) -> Path:
    """``--socket``, else $WEAVE_DAEMON_SOCKET, else .state/weaved/weaved.sock."""
    if explicit is not None:
        return explicit
    env = os.environ.get(SOCKET_ENV)
    return Path(env) if env else DEFAULT_STATE_DIR / SOCKET_NAME


class DaemonClient(LineClient):
    """One connection to weaved; a context manager."""

    server = "weaved"
    start_hint = f"start it with 'weave daemon' or set --socket / {SOCKET_ENV}"

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        return self.request({"op": op.value, **args}, protocol.LOCAL_ERRORS)
