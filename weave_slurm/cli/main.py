"""The ``weave`` command: a thin typer app; each subcommand lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from weave_slurm.cli.cluster import cluster_app
from weave_slurm.cli.config_cmd import config_app
from weave_slurm.cli.daemon_cmd import daemon
from weave_slurm.cli.demo import demo
from weave_slurm.cli.errors import entry
from weave_slurm.cli.node import node_app
from weave_slurm.cli.plan import plan
from weave_slurm.cli.simulate import simulate, trace_app
from weave_slurm.cli.spank import spank_app
from weave_slurm.cli.status import mount as mount_status
from weave_slurm.cli.version import package_version, version_option

app = typer.Typer(name="weave", help="Co-execution of synchronous RL jobs on Slurm GPU pools.",
                  no_args_is_help=True, pretty_exceptions_enable=False,
                  add_completion=False)


@app.callback()
def _weave(version: Annotated[bool, version_option()] = False) -> None:
    """Co-execution of synchronous RL jobs on Slurm GPU pools."""


app.command("plan")(plan)
app.add_typer(config_app, name="config")
app.add_typer(cluster_app, name="cluster")
app.add_typer(node_app, name="node")
app.command("simulate")(simulate)
app.add_typer(trace_app, name="trace")
app.add_typer(spank_app, name="spank")
app.command("daemon")(daemon)
app.command("demo")(demo)
mount_status(app)


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(f"weave-slurm {package_version()}")


main = entry(app, "weave")
