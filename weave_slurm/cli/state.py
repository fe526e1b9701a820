"""``weave state backup | migrate``: weaved's state database, as an admin keeps it
(thin CLI over :mod:`weave_slurm.daemon.state_admin`; docs/deploy.md, "Backup")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.daemon.client import DEFAULT_STATE_DIR

state_app = typer.Typer(help="weaved's state database: backup and schema migration.",
                        no_args_is_help=True)

_StateDir = Annotated[Path, typer.Option("--state-dir", help="weaved's state dir.")]


@state_app.command("backup")
def backup_cmd(
    out: Annotated[Path, typer.Argument(help="Where the copy goes (mode 0600).")],
    state_dir: _StateDir = DEFAULT_STATE_DIR,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")]
    = False,
) -> None:
    """An online, consistent copy of the state database (weaved may run)."""
    from weave_slurm.daemon.state_admin import backup

    done = backup(state_dir, out, force=force)
    typer.echo(f"backed up {state_dir / 'weaved.db'} to {done.path} ({done.bytes} bytes, "
               f"schema version {done.schema_version})")


@state_app.command("migrate")
def migrate_cmd(
    state_dir: _StateDir = DEFAULT_STATE_DIR,
    check: Annotated[bool, typer.Option("--check", help="Only say what would be done.")]
    = False,
    backup_to: Annotated[Path | None, typer.Option(
        "--backup", help="Where the old file's copy goes (default "
        "<state-dir>/weaved.db.v<old>.bak).")] = None,
) -> None:
    """Bring the state database to this weave's schema (weaved stopped; a backup first)."""
    from weave_slurm.daemon.schema import SCHEMA_VERSION
    from weave_slurm.daemon.state_admin import migrate

    done = migrate(state_dir, backup_to=backup_to, check_only=check)
    if check:
        verb = "up to date" if done.before == str(SCHEMA_VERSION) else \
            f"would migrate it to {SCHEMA_VERSION}"
        typer.echo(f"schema version {done.before}: {verb}")
    elif done.backup is None:
        typer.echo(f"schema version {done.before}: up to date, nothing done")
    else:
        typer.echo(f"migrated schema version {done.before} -> {done.after}; the old file "
                   f"is backed up at {done.backup.path}")
