"""What ``scontrol`` does to a job, for weave jobs: ``weave hold ID...``, ``weave
release ID...`` and ``weave update ID``.

A held job stays PENDING (REASON ``held by its user``) until it is released; only a
pending job can be held or released. ``weave-sbatch --hold`` submits a job held.
``weave update`` changes a job's name, time limit or (pending) SLO
(``daemon/job_update.py`` says who may change what).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op

_Ids = Annotated[list[int], typer.Argument(help="Job ids.")]
_Socket = Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")]


def hold(job_ids: _Ids, socket_path: _Socket = None) -> None:
    """Hold pending jobs: not placed until weave release (exit 1 if any id fails)."""
    _ask(Op.HOLD, "hold", job_ids, socket_path)


def release(job_ids: _Ids, socket_path: _Socket = None) -> None:
    """Release held jobs: placed in their turn again (exit 1 if any id fails)."""
    _ask(Op.RELEASE, "release", job_ids, socket_path)


def update(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    name: Annotated[str | None, typer.Option("--name", "-J", help="Its new name.")] = None,
    time: Annotated[str | None, typer.Option("--time", "-t", help="Its new time limit "
                                             "(M, M:S, HH:MM:SS, D-H, D-HH:MM, "
                                             "D-HH:MM:SS, UNLIMITED).")] = None,
    slo: Annotated[float | None, typer.Option("--slo", help="Its new permitted slowdown "
                                              "(a pending job).")] = None,
    socket_path: _Socket = None,
) -> None:
    """Change a job's name, time limit or SLO, as scontrol update."""
    with DaemonClient(default_socket(socket_path)) as client:
        result = client.call(Op.UPDATE, job=job_id, name=name, time=time, slo=slo)
    for change in result["changes"]:
        typer.echo(f"job {job_id}: {change}")


def _ask(op: Op, name: str, ids: list[int], socket_path: Path | None) -> None:
    with DaemonClient(default_socket(socket_path)) as client:
        result = client.call(op, jobs=ids)
    failed = [r for r in result["results"] if not r["ok"]]
    for r in failed:
        typer.echo(f"weave {name}: error: {r['message']}", err=True)
    if failed:
        raise typer.Exit(1)
