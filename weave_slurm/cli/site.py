"""``weave site check``: the preflight of a site before weaved runs there (thin CLI).

Takes the flags ``weave daemon`` takes (the same values), prints one line per check
(:mod:`weave_slurm.daemon.preflight`) and exits 1 if any failed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.daemon.client import DEFAULT_STATE_DIR, SOCKET_NAME

site_app = typer.Typer(help="The site weaved runs on: a preflight check.",
                       no_args_is_help=True)


@site_app.command("check")
def check(
    site: Annotated[Path | None, typer.Option("--site", help="Site config TOML "
                                              "(default: the built-in site).")] = None,
    state_dir: Annotated[Path, typer.Option("--state-dir", help="weaved's state dir.")] =
    DEFAULT_STATE_DIR,
    socket_path: Annotated[Path | None, typer.Option(
        "--socket", help="weaved's API socket (default <state-dir>/weaved.sock).")] = None,
    checkpoint_root: Annotated[Path | None, typer.Option(
        "--checkpoint-root", help="The shared checkpoint root weaved will be given.")] = None,
    path_root: Annotated[list[Path] | None, typer.Option(
        "--path-root", help="A shared directory job specs may name (repeatable).")] = None,
    munge_socket: Annotated[str | None, typer.Option(
        "--munge-socket", envvar="MUNGE_SOCKET", help="munged's socket.")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="The metrics port weaved will listen on.")] = None,
    metrics_addr: Annotated[str, typer.Option(
        "--metrics-addr", help="... and its address.")] = "127.0.0.1",
    as_user: Annotated[str, typer.Option(
        "--as-user", help="An ordinary user to check the node interpreter as.")] = "nobody",
) -> None:
    """Check partitions and GRES, Slurm's accounting (limits.from_slurm), munge, shared
    paths, the node interpreter, the OCI runtime (oci.conf), the state dir and the ports;
    one line each, exit code 1 if any failed."""
    from weave_slurm.config.oci import oci_conf_path
    from weave_slurm.config.site import default_site, load_site
    from weave_slurm.daemon.preflight import SiteFacts, Status, run_checks
    from weave_slurm.slurm.accounting import read_accounting
    from weave_slurm.slurm.cli_backend import SlurmCliBackend
    from weave_slurm.slurm.command_runner import SubprocessRunner

    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        from weave_slurm.errors import ConfigError

        raise ConfigError(f"--metrics-port {metrics_port!r}: must be a TCP port (0-65535)")
    facts = SiteFacts(
        site=load_site(site) if site else default_site(), state_dir=state_dir,
        socket=socket_path or state_dir / SOCKET_NAME, checkpoint_root=checkpoint_root,
        path_roots=tuple(path_root or ()), node_python=sys.executable, user=as_user,
        munge_socket=munge_socket,
        metrics=None if metrics_port is None else (metrics_addr, metrics_port),
        oci_conf=oci_conf_path())
    env = {k: v for k, v in os.environ.items() if k in ("SLURM_CONF", "MUNGE_SOCKET")}
    backend = SlurmCliBackend(env=env)
    checks = run_checks(facts, backend.nodes, lambda: read_accounting(
        SubprocessRunner(), env, facts.site.limits.slurm_cluster))
    for c in checks:
        typer.echo(c.line())
    failed = sum(c.status is Status.FAIL for c in checks)
    if failed:
        typer.echo(f"weave site check: {failed} of {len(checks)} checks failed", err=True)
        raise typer.Exit(1)
