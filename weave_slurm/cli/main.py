"""The ``weave`` command: a thin typer app; each subcommand lives in its own module.

A subcommand's module is imported only when that command runs (:class:`LazyGroup`), so
``weave status`` loads the status view and the daemon client, not the simulator, the
cluster tooling or torch.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from typer._click.core import Command, Context
from typer.core import TyperGroup

from weave_slurm.cli.error_lines import entry
from weave_slurm.cli.version import package_version, version_option

#: Every subcommand: its module and the attribute there (a function or a typer app).
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("weave_slurm.cli.status", "status"),
    "groups": ("weave_slurm.cli.status", "groups"),
    "cancel": ("weave_slurm.cli.status", "cancel"),
    "show": ("weave_slurm.cli.status", "show"),
    "logs": ("weave_slurm.cli.job_logs", "logs"),
    "hold": ("weave_slurm.cli.job_control", "hold"),
    "release": ("weave_slurm.cli.job_control", "release"),
    "update": ("weave_slurm.cli.job_control", "update"),
    "compare": ("weave_slurm.cli.compare", "compare"),
    "sacct": ("weave_slurm.cli.sacct", "sacct"),
    "plan": ("weave_slurm.cli.plan", "plan"),
    "config": ("weave_slurm.cli.config_cmd", "config_app"),
    "cluster": ("weave_slurm.cli.cluster", "cluster_app"),
    "node": ("weave_slurm.cli.node", "node_app"),
    "simulate": ("weave_slurm.cli.simulate", "simulate"),
    "trace": ("weave_slurm.cli.simulate", "trace_app"),
    "spank": ("weave_slurm.cli.spank", "spank_app"),
    "site": ("weave_slurm.cli.site", "site_app"),
    "state": ("weave_slurm.cli.state", "state_app"),
    "daemon": ("weave_slurm.cli.daemon_cmd", "daemon"),
    "demo": ("weave_slurm.cli.demo", "demo"),
    "version": ("weave_slurm.cli.main", "version"),
}


class LazyGroup(TyperGroup):
    """A group whose commands are imported on first use (see module doc)."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        obj: Any = getattr(importlib.import_module(where[0]), where[1])
        parent = typer.Typer(add_completion=False)   # as app.add_typer / app.command do
        if isinstance(obj, typer.Typer):
            parent.add_typer(obj, name=cmd_name)
        else:
            parent.command(cmd_name)(obj)
        return typer.main.get_group(parent).commands[cmd_name]


app = typer.Typer(name="weave", help="Co-execution of synchronous RL jobs on Slurm GPU pools.",
                  no_args_is_help=True, pretty_exceptions_enable=False,
                  add_completion=False, cls=LazyGroup)


@app.callback()
def _weave(version: Annotated[bool, version_option()] = False) -> None:
    """Co-execution of synchronous RL jobs on Slurm GPU pools."""


def version() -> None:
    """Print the version."""
    typer.echo(f"weave-slurm {package_version()}")


main = entry(app, "weave")
