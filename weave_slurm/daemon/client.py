"""Talking to weaved: one JSON-lines connection (used by weave-sbatch and weave status).

A client waits a few seconds for a weaved that is starting (its socket not there yet, or
nobody listening on it yet) before it says there is none, as Slurm's commands keep
trying slurmctld for up to ``MessageTimeout`` seconds: ``weave daemon & weave-sbatch
job.toml`` submits. ``$WEAVE_DAEMON_WAIT_S`` sets how long (0: not at all).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weave_slurm.daemon import protocol
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import ConfigError
from weave_slurm.wire import LineClient

DEFAULT_STATE_DIR = Path(".state/weaved")
SOCKET_NAME = "weaved.sock"
SOCKET_ENV = "WEAVE_DAEMON_SOCKET"
WAIT_ENV = "WEAVE_DAEMON_WAIT_S"
#: Seconds a client keeps asking for a weaved that is starting (Slurm's MessageTimeout
#: is 10 by default; weaved's socket opens in well under one).
DEFAULT_WAIT_S = 5.0


#: Where weaved listens when it runs as the site's service (weaved.service, docs/deploy.md).
SERVICE_SOCKET = Path("/var/lib/weave") / SOCKET_NAME


def default_socket(explicit: Path | None = None) -> Path:
    """``--socket``, else $WEAVE_DAEMON_SOCKET, else a weaved started in this directory
    (``.state/weaved/weaved.sock``, as README's), else the site's service
    (:data:`SERVICE_SOCKET`): found from any directory, as Slurm's clients find
    slurmctld from slurm.conf wherever they run. None there: this directory's path,
    which the client waits for (a weaved starting here)."""
    if explicit is not None:
        return explicit
    env = os.environ.get(SOCKET_ENV)
    if env:
        return Path(env)
    local = DEFAULT_STATE_DIR / SOCKET_NAME
    if not local.exists() and SERVICE_SOCKET.exists():
        return SERVICE_SOCKET
    return local


def wait_for_daemon_s(env: Mapping[str, str] | None = None) -> float:
    """$WEAVE_DAEMON_WAIT_S, else :data:`DEFAULT_WAIT_S`: how long to wait for a weaved
    that is starting."""
    raw = (os.environ if env is None else env).get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{WAIT_ENV}={raw!r}: must be seconds >= 0 (how long to wait for "
                          f"a weaved that is starting; 0: not at all)")
    return seconds


class DaemonClient(LineClient):
    """One connection to weaved; a context manager."""

    server = "weaved"
    start_hint = f"start it with 'weave daemon' or set --socket / {SOCKET_ENV}"

    def __init__(self, socket_path: Path, timeout_s: float = 30.0,
                 max_reply_bytes: int = 1 << 30, wait_s: float | None = None) -> None:
        """``wait_s``: how long to wait for a weaved that is starting (None: the
        environment's :func:`wait_for_daemon_s`)."""
        super().__init__(socket_path, timeout_s, max_reply_bytes,
                         wait_for_daemon_s() if wait_s is None else wait_s)

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        return self.request({"op": op.value, **args}, protocol.LOCAL_ERRORS)
