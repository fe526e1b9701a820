"""Turning exceptions into one line and an exit code, at the CLI boundary only."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import click
import typer

from weave_slurm.errors import WeaveError


def run_app(app: typer.Typer, prog: str, argv: list[str] | None = None) -> int:
    """Run a typer app; any WeaveError becomes ``prog: message`` and its exit code."""
    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(levelname)s: %(message)s")
    try:
        app(args=argv, prog_name=prog, standalone_mode=False)
    except WeaveError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        print(f"{prog}: aborted", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


def entry(app: typer.Typer, prog: str) -> Callable[[], None]:
    def main() -> None:
        sys.exit(run_app(app, prog))

    return main
