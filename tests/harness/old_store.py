"""A state database as a weaved of an older schema left it: a file of today's schema
with what each later migration added taken out again (daemon/schema.py MIGRATIONS), so a
new migration needs no edit in the tests that open old files."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from weave_slurm.daemon.schema import MIGRATIONS

_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")
_CREATE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)")


def undo(statement: str) -> str | None:
    """The statement that takes out what ``statement`` added (None: nothing to undo,
    e.g. an index, which goes with its table)."""
    if m := _ADD_COLUMN.match(statement.strip()):
        return f"ALTER TABLE {m[1]} DROP COLUMN {m[2]}"
    if m := _CREATE.match(statement.strip()):
        return f"DROP TABLE {m[1]}"
    return None


def make_old(path: Path, version: int) -> None:
    """Turn the closed store file ``path`` into one of schema ``version``."""
    con = sqlite3.connect(path)
    for old in sorted((v for v in MIGRATIONS if int(v) >= version), key=int, reverse=True):
        for stmt in reversed(MIGRATIONS[old]):
            down = undo(stmt)
            if down is not None:
                con.execute(down)
    con.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    con.commit()
    con.close()
