"""``weave daemon``: run weaved in the foreground (its logging is configured here)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from weave_slurm.cli.logs import file_handler, setup_logging
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
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Serve Prometheus metrics on this TCP port (0: any free "
        "port; default: no metrics).")] = None,
    metrics_addr: Annotated[str, typer.Option(
        "--metrics-addr", help="Address the metrics endpoint listens on.")] = "127.0.0.1",
    log_file: Annotated[Path | None, typer.Option(
        "--log-file", help="Log to this file instead of stderr.")] = None,
    log_max_mib: Annotated[float, typer.Option(
        "--log-max-mib", help="Rotate the log file at this size, keeping --log-backups "
        "old ones (0: never; logrotate rotates it, weaved reopens it).")] = 64.0,
    log_backups: Annotated[int, typer.Option(
        "--log-backups", help="Rotated log files kept (PATH.1 ...).")] = 5,
    print_unit: Annotated[bool, typer.Option(
        "--print-unit", help="Print weaved's systemd unit for this installation and "
        "exit (docs/deploy.md).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    """Run the meta-scheduler daemon in the foreground until SIGTERM/SIGINT."""
    import shlex

    if print_unit:
        typer.echo(unit_text(), nl=False)
        return
    handler = None if log_file is None else file_handler(log_file, log_max_mib, log_backups)
    from weave_slurm.daemon.service import DaemonConfig, Weaved  # not for --help

    setup_logging(logging.INFO if verbose else logging.WARNING, "weaved", timestamps=True,
                  to=handler)
    cfg = DaemonConfig(state_dir=state_dir, socket_path=socket_path, backend=backend,
                       site_path=site, instance=instance, tick_s=tick_s,
                       admin_uids=tuple(admin_uid or ()),
                       path_roots=tuple(p.resolve() for p in path_root or ()),
                       node_command=tuple(shlex.split(node_command)) if node_command else None,
                       runtime=runtime, checkpoint_root=checkpoint_root,
                       node_socket_dir=node_socket_dir, munge_socket=munge_socket,
                       metrics_port=metrics_port, metrics_addr=metrics_addr,
                       env={k: v for k, v in os.environ.items()
                            if k in ("SLURM_CONF", "MUNGE_SOCKET")})
    weaved = Weaved(cfg)

    def _stop(signum: int, frame: FrameType | None) -> None:
        weaved.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(f"weaved: listening on {cfg.socket}", err=True)
    if weaved.metrics_port is not None:
        typer.echo(f"weaved: metrics on http://{metrics_addr}:{weaved.metrics_port}/metrics",
                   err=True)
    weaved.run()


def unit_text() -> str:
    """The packaged systemd unit (``weave_slurm/deploy/weaved.service``) with ``@PYTHON@``
    replaced by this interpreter."""
    import sys
    from importlib.resources import files

    text = files("weave_slurm").joinpath("deploy", "weaved.service").read_text()
    return text.replace("@PYTHON@", sys.executable)
