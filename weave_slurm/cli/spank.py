"""``weave spank path|build``: the SPANK plugin from an installed wheel (thin CLI).

The plugin's source ships in the package (:mod:`weave_slurm.spank`); ``build`` runs its
Makefile (the same gcc line as the repository's ``make spank``) into a directory of
your choice, since the installed package itself may be read-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weave_slurm import spank

spank_app = typer.Typer(help="The weave SPANK plugin (--weave-slo, --weave-group, "
                        "--weave-spec): its source, and a build of it.", no_args_is_help=True)


@spank_app.command("path")
def path() -> None:
    """Print the directory holding the plugin's source (weave.c, Makefile)."""
    typer.echo(str(spank.source_dir()))


@spank_app.command("build")
def build(
    out: Annotated[Path, typer.Option("--out", help="Directory for weave.so (created).")],
    slurm_include: Annotated[Path, typer.Option(
        "--slurm-include", help="Directory holding slurm/spank.h.")] = spank.DEFAULT_SLURM_INCLUDE,
    sockdir: Annotated[Path, typer.Option(
        "--sockdir", help="Node-daemon socket dir, for the plugstack.conf line printed.")]
    = Path("/run/weave"),
) -> None:
    """Compile weave.so into OUT and print the plugstack.conf line that loads it."""
    so = spank.build(out, slurm_include)
    typer.echo(f"built {so}")
    typer.echo(f"plugstack.conf: optional {so} sockdir={sockdir}")
