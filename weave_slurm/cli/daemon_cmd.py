"""``weave daemon``: run weaved in the foreground (its logging is configured here)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from weave_slurm.cli.logs import setup_logging
from weave_slurm.daemon.client import DEFAULT_STATE_DIR
from weave_slurm.daemon.driver import DriverKind


def daemon(
    state_dir: Annotated[Path, typer.Option("--state-dir", help="Store, socket, logs.")] =
    DEFAULT_STATE_DIR,
    backend: Annotated[str, typer.Option("--backend", help="local or slurm.")] = "local",
    site: Annotated[Path | None, typer.Option("--site", help="Site config TOML.")] = None,
    socket_path: Annotated[Path | None, typer.Option(
        "--socket", help="API socket (default <state-dir>/weaved.sock).")] = None,
    instance: Annotated[str, typer.Option(
        "--instance", help="Name distinguishing daemons that share one Slurm.")] = "",
    tick_s: Annotated[float, typer.Option("--tick-s", help="Seconds between ticks.")] = 1.0,
    admin_uid: Annotated[list[int] | None, typer.Option(
        "--admin-uid", help="A uid that may act on every job (repeatable).")] = None,
    path_root: Annotated[list[Path] | None, typer.Option(
        "--path-root", help="A shared directory that paths in job specs may name, besides "
        "the submitting user's home (repeatable).")] = None,
    node_command: Annotated[str | None, typer.Option(
        "--node-command", help="Node-daemon command (shell words); default 'weave node "
        "serve'.")] = None,
    checkpoint_root: Annotated[Path | None, typer.Option(
        "--checkpoint-root", help="Where node daemons keep checkpoints (<root>/<node>): a "
        "file system this host and every node share, at the same path (default "
        "<state-dir>/ckpt: only where weaved and the nodes share a host).")] = None,
    node_socket_dir: Annotated[Path | None, typer.Option(
        "--node-socket-dir", help="Node-local directory of the node daemons' sockets for "
        "job tasks (default /run/weave on Slurm: the weave SPANK plugin's sockdir).")] = None,
    munge_socket: Annotated[str | None, typer.Option(
        "--munge-socket", envvar="MUNGE_SOCKET",
        help="munged's socket on this host and the nodes (default munge's own).")] = None,
    runtime: Annotated[DriverKind, typer.Option(
        "--runtime", help="rl: run the jobs' RL phases round-robin on the node daemons; "
        "idle: only hold allocations and idle steps; auto: rl unless --node-command is "
        "given.")] = DriverKind.AUTO,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    """Run the meta-scheduler daemon in the foreground until SIGTERM/SIGINT."""
    import shlex

    from weave_slurm.daemon.service import DaemonConfig, Weaved  # imports torch: only here

    setup_logging(logging.INFO if verbose else logging.WARNING, "weaved", timestamps=True)
    cfg = DaemonConfig(state_dir=state_dir, socket_path=socket_path, backend=backend,
                       site_path=site, instance=instance, tick_s=tick_s,
                       admin_uids=tuple(admin_uid or ()),
                       path_roots=tuple(p.resolve() for p in path_root or ()),
                       node_command=tuple(shlex.split(node_command)) if node_command else None,
                       runtime=runtime, checkpoint_root=checkpoint_root,
                       node_socket_dir=node_socket_dir, munge_socket=munge_socket,
                       env={k: v for k, v in os.environ.items()
                            if k in ("SLURM_CONF", "MUNGE_SOCKET")})
    weaved = Weaved(cfg)

    def _stop(signum: int, frame: FrameType | None) -> None:
        weaved.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(f"weaved: listening on {cfg.socket}", err=True)
    weaved.run()
