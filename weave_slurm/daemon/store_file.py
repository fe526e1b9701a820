"""Opening the daemon's state file: check it, create it or migrate it, read every row.

A file that is not a database, fails ``quick_check``, has a row its parser refuses or
another schema version raises :class:`StateError`: the daemon never runs on state it
cannot read. A file of an older schema is migrated in place, one version at a time,
each in one transaction (:mod:`~weave_slurm.daemon.schema`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from weave_slurm.daemon.schema import BACKFILLS, MIGRATIONS, SCHEMA, SCHEMA_VERSION
from weave_slurm.errors import StateError

#: (table, key column, the row's parser): every row must pass its parser.
Readers = Sequence[tuple[str, str, Callable[[sqlite3.Row], Any]]]


def one_line(check: str) -> str:
    """SQLite's quick_check report (several problems: several lines) on one line."""
    return " ".join(str(check).split())


def open_file(db: sqlite3.Connection, path: Path,
              tx: Callable[[], AbstractContextManager[sqlite3.Connection]],
              readers: Readers) -> None:
    """Bring the file behind ``db`` to today's schema and check it (module doc)."""
    # check before anything writes: journal_mode=WAL rewrites the file header, and a
    # file we refuse must be left exactly as it was found
    check = db.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise StateError(f"state database {str(path)!r} fails quick_check "
                         f"({one_line(check)}); "
                         "restore a backup or move it away to start afresh")
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        with tx():
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        _pragmas(db)
        return
    if "meta" not in tables:
        raise StateError(f"{str(path)!r} is an SQLite file but not a weaved state "
                         f"database (tables: {sorted(tables)})")
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    version = row[0] if row else None
    while version in MIGRATIONS:
        with tx():
            for stmt in MIGRATIONS[version]:
                db.execute(stmt)
            if version in BACKFILLS:
                BACKFILLS[version](db)
            version = str(int(version) + 1)
            db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
    if version != str(SCHEMA_VERSION):
        raise StateError(f"state database {str(path)!r} has schema version "
                         f"{version!r}; this weaved reads version {SCHEMA_VERSION}")
    _check_rows(db, path, readers)
    _pragmas(db)


def _check_rows(db: sqlite3.Connection, path: Path, readers: Readers) -> None:
    """Read every row through its parser: SQLite has no page checksums, so garbage
    inside a row passes quick_check; it must not pass this."""
    for table, col, parse in readers:
        key: object = None
        try:
            for r in db.execute(f"SELECT * FROM {table} ORDER BY {col}"):
                key = r[col]
                parse(r)
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError, KeyError,
                TypeError, StateError) as exc:
            where = f"at or after {col}={key}" if key is not None else "its first row"
            raise StateError(f"state database {str(path)!r}: table {table}, {where}, "
                             f"is unreadable ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); restore a "
                             "backup or move it away to start afresh") from exc


def _pragmas(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
