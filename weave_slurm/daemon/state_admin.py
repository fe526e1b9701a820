"""The state directory's database as an admin handles it: an online backup and an
explicit schema migration (``weave state backup`` / ``weave state migrate``).

A backup goes through SQLite's online backup API (pages copied under SQLite's own
locking, the WAL included), so it is consistent while weaved runs; the copy is checked
(``PRAGMA quick_check``, a weaved schema version) before it is renamed into place, mode
0600 like the store. A migration needs weaved stopped (it takes weaved's life lock,
``weaved.lock``), takes a backup of the old file first (``weaved.db.v<old>.bak`` next to
it, unless told where) and then opens the store, which brings the file to this weave's
schema version (``daemon/schema.py``, ``MIGRATIONS``) in one transaction per version.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from weave_slurm.daemon.schema import SCHEMA_VERSION
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.store_file import one_line
from weave_slurm.errors import ConfigError, StateError

DB_NAME = "weaved.db"
LOCK_NAME = "weaved.lock"


@dataclass(frozen=True)
class Backup:
    path: Path
    bytes: int
    schema_version: str


@dataclass(frozen=True)
class Migration:
    before: str
    after: str
    backup: Backup | None     # None: nothing to migrate, nothing copied


def database(state_dir: Path) -> Path:
    """``<state_dir>/weaved.db``; one line naming the path when there is none."""
    db = state_dir / DB_NAME
    if not db.is_file():
        raise ConfigError(f"--state-dir {str(state_dir)!r}: no {DB_NAME} there (not a "
                          "weaved state directory, or weaved never ran on it)")
    return db


def schema_version(db: Path) -> str:
    """The file's schema version, read without changing it."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{str(db)!r} is not a readable weaved state database "
                             f"({exc})") from None
    if row is None:
        raise StateError(f"{str(db)!r} has no schema version (not a weaved state database)")
    return str(row[0])


def backup(state_dir: Path, out: Path, *, force: bool = False) -> Backup:
    """An online copy of the state database at ``out`` (checked, then renamed there)."""
    db = database(state_dir)
    if out.exists() and not force:
        raise ConfigError(f"{str(out)!r} exists; give another path or --force")
    if out.resolve() == db.resolve():
        raise ConfigError(f"{str(out)!r} is the database itself")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.part")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as src, \
                contextlib.closing(sqlite3.connect(tmp)) as dst:
            src.backup(dst)
            check = dst.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StateError(f"the copy of {str(db)!r} fails quick_check "
                                 f"({one_line(check)})")
        version = schema_version(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return Backup(out, out.stat().st_size, version)


def migrate(state_dir: Path, *, backup_to: Path | None = None,
            check_only: bool = False) -> Migration:
    """Bring the state database to this weave's schema, after a backup of the old file;
    ``check_only``: say what would be done, change nothing."""
    db = database(state_dir)
    before = schema_version(db)
    if not before.isdigit() or int(before) > SCHEMA_VERSION:
        raise StateError(f"{str(db)!r} has schema version {before!r}; this weave reads "
                         f"versions 1-{SCHEMA_VERSION} (a newer weave wrote it?)")
    if before == str(SCHEMA_VERSION) or check_only:
        return Migration(before, before if check_only else str(SCHEMA_VERSION), None)
    lock = FileLock(str(state_dir / LOCK_NAME), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise StateError(f"a weaved holds {str(state_dir)!r}; stop it before migrating "
                         "(systemctl stop weaved)") from None
    try:
        copy = backup(state_dir, backup_to or db.with_name(f"{DB_NAME}.v{before}.bak"))
        Store(db).close()
    finally:
        lock.release()
    return Migration(before, schema_version(db), copy)
