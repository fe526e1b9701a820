"""``weave compare A B``: whether two jobs ended with the same weights, as ``cmp`` says
whether two files are equal.

It compares the SHA-256 of each job's final weights that weaved stored when the job
completed (``weave show job N``: ``weights_sha256``). Run a job alone with the same spec
(``weave-sbatch --solo``) and compare it with the grouped run: equal digests are the
proof that co-execution changed nothing it learned. Exit 0: equal; 1: different; 2: a
job has no digest (not completed, or cooperative: its weights are its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import WeaveError


class NoDigest(WeaveError):
    """A job has no final weights' digest to compare (exit 2, as cmp's trouble)."""

    exit_code = 2


def compare(
    first: Annotated[int, typer.Argument(help="A job id.")],
    second: Annotated[int, typer.Argument(help="Another job id (e.g. its --solo run).")],
    socket_path: Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")]
    = None,
) -> None:
    """Whether jobs FIRST and SECOND ended with the same weights (exit 0, else 1)."""
    with DaemonClient(default_socket(socket_path)) as client:
        digests = [_digest(client.call(Op.SHOW, kind="job", id=job)) for job in (first, second)]
    if digests[0] == digests[1]:
        typer.echo(f"equal: jobs {first} and {second} ended with the same weights "
                   f"(sha256 {digests[0]})")
        return
    typer.echo(f"different: job {first} ended with sha256 {digests[0]}, job {second} with "
               f"{digests[1]}")
    raise typer.Exit(1)


def _digest(shown: dict[str, Any]) -> str:
    digest = shown.get("weights_sha256")
    if not digest:
        raise NoDigest(f"job {shown['job']} has no final weights' digest to compare "
                       f"({shown.get('weights_sha256_why', 'none')})")
    return str(digest)
