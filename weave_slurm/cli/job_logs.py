"""``weave logs ID [-f] [-e]``: a job's output file, as ``cat`` (``-f``: ``tail -f``).

weaved says where the job's output goes (``weave show job``'s ``stdout``/``stderr``:
the ``--output`` and ``--error`` it was submitted with; ``weave-%j.out`` in its
workdir, else its home, by default); the file itself is read here, as you, on
the file system the login host shares with the nodes. ``-f`` follows it until the job
has ended and nothing more came for a moment, as ``tail -f`` would (Ctrl-C stops
earlier).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import ConfigError

#: How often ``-f`` looks for more, and how long it keeps looking after the job ended.
POLL_S = 0.5
SETTLE_S = 2.0


def logs(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing what is "
                                         "written until the job has ended.")] = False,
    errors: Annotated[bool, typer.Option("--error", "-e", help="Its --error file instead "
                                         "(the same file unless it named another).")]
    = False,
    socket_path: Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")]
    = None,
) -> None:
    """Print a job's output (its --output file), like cat; -f follows it like tail -f."""
    sock = default_socket(socket_path)
    shown = _show(sock, job_id)
    path = str(shown.get("stderr" if errors else "stdout") or "")
    if not path:
        raise ConfigError(f"job {job_id} has no output file: an older weaved stored it "
                          "without one")
    out = sys.stdout.buffer
    done = JobState(shown["state"]).final
    opened: BinaryIO | None = _open(path)
    if opened is None and not follow:
        typer.echo(f"weave logs: job {job_id}: nothing written to {path} yet", err=True)
        return
    quiet_since = None
    try:
        while True:
            if opened is None:
                opened = _open(path)
            chunk = opened.read() if opened is not None else b""
            if chunk:
                out.write(chunk)
                out.flush()
                quiet_since = None
            if not follow:
                return
            if done:      # ended: stop once nothing more came for SETTLE_S
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= SETTLE_S:
                    return
            time.sleep(POLL_S)
            if not done:
                done = JobState(_show(sock, job_id)["state"]).final
    finally:
        if opened is not None:
            opened.close()


def _show(sock: Path, job_id: int) -> dict[str, Any]:
    with DaemonClient(sock) as client:
        return dict(client.call(Op.SHOW, kind="job", id=job_id))


def _open(path: str) -> BinaryIO | None:
    """The file, or None while it does not exist (the job has not written yet)."""
    try:
        return open(path, "rb")   # closed by the caller
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the job's output ({exc.strerror})") from None
