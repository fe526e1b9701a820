"""``weave cluster up|down|status``: the local one-host Slurm cluster (thin CLI).

The lead mounts ``cluster_app`` as ``weave cluster``. All work is in
:mod:`weave_slurm.slurm.cluster`; this module parses flags, prints, and turns a
:class:`~weave_slurm.errors.WeaveError` into one line and its exit code.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from weave_slurm.cli.logs import setup_logging
from weave_slurm.errors import WeaveError
from weave_slurm.slurm.cluster import DEFAULT_STATE_DIR, ClusterStatus, LocalCluster
from weave_slurm.slurm.cluster_config import parse_layout

cluster_app = typer.Typer(help="A local Slurm cluster (slurmctld + one slurmd per fake node).",
                          no_args_is_help=True)

StateDir = Annotated[Path, typer.Option("--state-dir", help="Where configs, pid files and "
                                        "logs of the cluster live.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _fail(exc: WeaveError) -> typer.Exit:
    typer.echo(f"weave cluster: {exc}", err=True)
    return typer.Exit(exc.exit_code)


def _print(status: ClusterStatus, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(status.to_json(), indent=2))
        return
    console = Console()
    table = Table(title=f"cluster {status.state_dir}")
    for col in ("NODELIST", "PARTITION", "STATE", "GRES"):
        table.add_column(col)
    for n in status.nodes:
        table.add_row(n.name, n.partition, n.state, n.gres)
    console.print(table)
    dead = [d.name for d in status.daemons if not d.alive]
    console.print(f"controller: {'UP' if status.controller_up else 'DOWN'}; daemons: "
                  f"{len(status.daemons) - len(dead)} running" +
                  (f", dead: {', '.join(dead)}" if dead else ""))


@cluster_app.command()
def up(state_dir: StateDir = DEFAULT_STATE_DIR,
       nodes: Annotated[str, typer.Option(help="Pools as PARTITION=COUNT (8 GPUs per node, "
                                          "GPU type = partition).")] = "h20=2,h800=2",
       spank: Annotated[Path | None, typer.Option(help="weave.so to load via "
                                                  "plugstack.conf.")] = None,
       sockdir: Annotated[Path | None, typer.Option(help="Node-daemon socket dir given to "
                                                    "the SPANK plugin.")] = None,
       timeout_s: Annotated[float, typer.Option("--timeout-s")] = 60.0,
       as_json: AsJson = False) -> None:
    """Start munged, slurmctld and the slurmds (idempotent), then print SLURM_CONF."""
    setup_logging(logging.WARNING, "weave cluster")
    try:
        status = LocalCluster(state_dir).up(parse_layout(nodes), spank_plugin=spank,
                                            socket_dir=sockdir, timeout_s=timeout_s)
    except WeaveError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print(status, True)
        return
    _print(status, False)
    how = "already up" if status.already_up else f"up in {status.up_s or 0.0:.2f} s"
    typer.echo(f"cluster {how}\nexport SLURM_CONF={status.slurm_conf}")


@cluster_app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR,
         timeout_s: Annotated[float, typer.Option("--timeout-s", help="SIGTERM grace before "
                                                  "SIGKILL.")] = 10.0) -> None:
    """Stop exactly the daemons `up` started (pid files), SIGTERM then SIGKILL."""
    stopped = LocalCluster(state_dir).down(timeout_s=timeout_s)
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@cluster_app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR, as_json: AsJson = False) -> None:
    """Show the cluster's daemons and nodes; exit 1 if it is not ready."""
    st = LocalCluster(state_dir).status()
    _print(st, as_json)
    if not st.ready:
        raise typer.Exit(1)
