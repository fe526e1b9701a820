"""``weave cluster up|down|status|exec|shape``: the local Slurm cluster (thin CLI).

The lead mounts ``cluster_app`` as ``weave cluster``. All work is in
:mod:`weave_slurm.slurm.local_cluster`; this module parses flags, prints, and turns a
:class:`~weave_slurm.errors.WeaveError` into one line and its exit code.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from weave_slurm.cli.logs import setup_logging
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.slurm.cluster_config import HostMode, parse_layout
from weave_slurm.slurm.local_cluster import (
    DEFAULT_STATE_DIR,
    ClusterStatus,
    LocalCluster,
    client_env,
)

cluster_app = typer.Typer(help="A local Slurm cluster (slurmctld + one slurmd per fake node, "
                          "on this host or each on a host of its own).", no_args_is_help=True)

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
    addrs = dict(status.addresses)
    for col in ("NODELIST", "PARTITION", "STATE", "GRES", *(("ADDR",) if addrs else ())):
        table.add_column(col)
    for n in status.nodes:
        table.add_row(n.name, n.partition, n.state, n.gres,
                      *((addrs.get(n.name, ""),) if addrs else ()))
    console.print(table)
    if status.addresses:
        login, addr = status.addresses[0]
        console.print(f"hosts: separate; login {login} at {addr}")
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
       hosts: Annotated[HostMode, typer.Option(
           help="shared: every slurmd on this host; separate: every node a host of its "
                "own (namespaces; needs root).")] = HostMode.SHARED,
       subnet: Annotated[str | None, typer.Option(
           help="Private subnet of the separate hosts (default: the first free /24 "
                "from 10.214.0.0/24).")] = None,
       interpool_gbps: Annotated[float | None, typer.Option(
           "--interpool-gbps", help="Shape the link between the pools (separate hosts).")]
       = None,
       timeout_s: Annotated[float, typer.Option("--timeout-s")] = 60.0,
       as_json: AsJson = False) -> None:
    """Start munged, slurmctld and the slurmds (idempotent), then print the exports a
    client needs (SLURM_CONF, and MUNGE_SOCKET for the cluster's own munged)."""
    setup_logging(logging.WARNING, "weave cluster")
    try:
        status = LocalCluster(state_dir).up(parse_layout(nodes), hosts=hosts, subnet=subnet,
                                            interpool_gbps=interpool_gbps, spank_plugin=spank,
                                            socket_dir=sockdir, timeout_s=timeout_s)
    except WeaveError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print(status, True)
        return
    _print(status, False)
    how = "already up" if status.already_up else f"up in {status.up_s or 0.0:.2f} s"
    typer.echo(f"cluster {how}; every client (weave, weaved, Slurm's commands) needs:")
    _exports(state_dir)


def _exports(state_dir: Path) -> None:
    for key, value in client_env(state_dir).items():
        typer.echo(f"export {key}={shlex.quote(value)}")


@cluster_app.command()
def env(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print the exports a client of the cluster needs: eval "$(weave cluster env)"."""
    if not LocalCluster(state_dir).status().controller_up:
        typer.echo(f"weave cluster: no cluster is up in {state_dir}; start it with "
                   "'weave cluster up'", err=True)
        raise typer.Exit(1)
    _exports(state_dir)


@cluster_app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR,
         timeout_s: Annotated[float, typer.Option("--timeout-s", help="SIGTERM grace before "
                                                  "SIGKILL.")] = 10.0) -> None:
    """Stop what `up` started (pid files; every process on separate hosts), remove the hosts."""
    try:
        stopped = LocalCluster(state_dir).down(timeout_s=timeout_s)
    except WeaveError as exc:
        raise _fail(exc) from exc
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@cluster_app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR, as_json: AsJson = False) -> None:
    """Show the cluster's daemons and nodes; exit 1 if it is not ready."""
    st = LocalCluster(state_dir).status()
    _print(st, as_json)
    if not st.ready:
        raise typer.Exit(1)


@cluster_app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(node: Annotated[str, typer.Argument(help="The node whose host runs the command.")],
          command: Annotated[list[str], typer.Argument(help="The command (after --).")],
          state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Run a command on a separate host (in its namespaces), e.g. `exec h20-0 -- ls /tmp`."""
    if command[:1] == ["--"]:  # typer keeps the separator when options stop at NODE
        command = command[1:]
    if not command:
        raise _fail(ConfigError("weave cluster exec: give a command after --, e.g. "
                                "'exec h20-0 -- hostname'"))
    try:
        argv = LocalCluster(state_dir).host_argv(node, command, cwd=Path("/"))
    except WeaveError as exc:
        raise _fail(exc) from exc
    os.execvp(argv[0], argv)  # this process becomes the command: its I/O, its exit code


@cluster_app.command()
def shape(state_dir: StateDir = DEFAULT_STATE_DIR,
          interpool_gbps: Annotated[float | None, typer.Option(
              "--interpool-gbps", help="Rate of the link between the pools, both ways.")]
          = None,
          off: Annotated[bool, typer.Option("--off", help="Remove the shaping.")] = False
          ) -> None:
    """Shape (or unshape) the inter-pool link of a separate-hosts cluster."""
    if (interpool_gbps is None) == (not off):
        raise _fail(ConfigError("weave cluster shape: give --interpool-gbps RATE or --off"))
    try:
        LocalCluster(state_dir).shape_interpool(None if off else interpool_gbps)
    except WeaveError as exc:
        raise _fail(exc) from exc
    typer.echo("inter-pool link: " + ("unshaped" if off else f"{interpool_gbps:g} Gbit/s"))
