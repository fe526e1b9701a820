"""``--version`` of ``weave`` and ``weave-sbatch``: the installed package's version."""

from __future__ import annotations

from typing import Any

import typer

from weave_slurm import __version__

DISTRIBUTION = "weave-slurm"


def package_version() -> str:
    """The installed distribution's version (a source tree not installed: ``__version__``).
    ``importlib.metadata`` is imported here: it costs ~90 ms, and only --version needs it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return __version__


def print_version(value: bool) -> None:
    """An eager ``--version`` option's callback: print ``weave-slurm X.Y.Z`` and exit 0."""
    if value:
        typer.echo(f"{DISTRIBUTION} {package_version()}")
        raise typer.Exit()


def version_option() -> Any:
    """A fresh ``--version/-V`` option; eager, so it answers before a missing argument."""
    return typer.Option("--version", "-V", callback=print_version, is_eager=True,
                        help="Print the version and exit.")
