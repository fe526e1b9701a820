"""The store's SQLite schema (a new file) and the migrations that bring a file an older
weaved wrote to it, one version at a time (``daemon/store.py`` applies them when it opens
a file; ``weave state migrate``: ``daemon/state_admin.py``; docs/daemon.md "Store schema").
A migration is SQL statements, then (:data:`BACKFILLS`) what fills the columns they added
from each row's older ones, in the same transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from weave_slurm.config.job import parse_job
from weave_slurm.config.job_codec import spec_to_json
from weave_slurm.daemon import usage_sql
from weave_slurm.errors import WeaveError

SCHEMA_VERSION = 9
#: version -> statements that bring a file of that version to the next one
MIGRATIONS: dict[str, tuple[str, ...]] = {
    # 2: the runtime's measured planning profile of a job (NULL until measured)
    "1": ("ALTER TABLE jobs ADD COLUMN measured TEXT",),
    # 3: what each allocation is charged to; usage records
    "2": ("ALTER TABLE allocations ADD COLUMN account TEXT",
          "ALTER TABLE allocations ADD COLUMN qos TEXT",
          "ALTER TABLE allocations ADD COLUMN time_limit_min INTEGER",
          *usage_sql.statements()),
    # 4: the group a job is being moved from by a re-plan (NULL: not moving)
    "3": ("ALTER TABLE jobs ADD COLUMN moving_from INTEGER",),
    # 5: the SHA-256 of a completed hosted job's final weights (NULL: none held)
    "4": ("ALTER TABLE jobs ADD COLUMN weights_sha256 TEXT",),
    # 6: the spec as parsed at submission (config/job_codec.py); NULL: one this weave
    # cannot read (an older weaved stored it)
    "5": ("ALTER TABLE jobs ADD COLUMN spec_json TEXT",),
    # 7: a job held by its user (weave-sbatch --hold, weave hold; weave release clears it)
    "6": ("ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0",),
    # 8: a job's recoveries so far, across weaved restarts (its REASON counts them)
    "7": ("ALTER TABLE jobs ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0",),
    # 9: the nodes of a held allocation given back to Slurm (a shrink by nodes)
    "8": ("ALTER TABLE allocations ADD COLUMN gone TEXT NOT NULL DEFAULT '[]'",),
}


def _typed_specs(db: sqlite3.Connection) -> None:
    """Schema 6: each stored spec parsed once more, for the last time. One this weave
    refuses keeps NULL, and its job goes on as a spec weaved cannot read did before."""
    rows = db.execute("SELECT job_id, spec, source FROM jobs WHERE spec_json IS NULL")
    for job_id, text, source in rows.fetchall():
        try:
            typed: str | None = spec_to_json(parse_job(text, source))
        except WeaveError:
            typed = None
        db.execute("UPDATE jobs SET spec_json=? WHERE job_id=?", (typed, job_id))


#: version -> what fills, from each row's older columns, what MIGRATIONS[version] added
BACKFILLS: dict[str, Callable[[sqlite3.Connection], None]] = {"5": _typed_specs}

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (
  job_id INTEGER PRIMARY KEY AUTOINCREMENT, uid INTEGER NOT NULL, user TEXT NOT NULL,
  name TEXT NOT NULL, spec TEXT NOT NULL, source TEXT NOT NULL, profile TEXT NOT NULL,
  measured TEXT, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', group_id INTEGER,
  submitted_s REAL NOT NULL, started_s REAL, ended_s REAL, moving_from INTEGER,
  weights_sha256 TEXT, spec_json TEXT, held INTEGER NOT NULL DEFAULT 0,
  recoveries INTEGER NOT NULL DEFAULT 0);
CREATE INDEX jobs_state ON jobs(state);
CREATE TABLE groups (
  group_id INTEGER PRIMARY KEY, label TEXT NOT NULL UNIQUE, state TEXT NOT NULL,
  plan TEXT NOT NULL, created_s REAL NOT NULL, reason TEXT NOT NULL DEFAULT '');
CREATE TABLE allocations (
  key INTEGER PRIMARY KEY AUTOINCREMENT, group_id INTEGER NOT NULL, role TEXT NOT NULL,
  pool TEXT NOT NULL, partition TEXT NOT NULL, node_count INTEGER NOT NULL,
  gpus_per_node INTEGER NOT NULL, gpu_type TEXT, cpus_per_node INTEGER NOT NULL,
  state TEXT NOT NULL, alloc_id TEXT, nodes TEXT NOT NULL DEFAULT '[]',
  reason TEXT NOT NULL DEFAULT '', updated_s REAL NOT NULL, account TEXT, qos TEXT,
  time_limit_min INTEGER, gone TEXT NOT NULL DEFAULT '[]');
CREATE TABLE steps (
  key INTEGER PRIMARY KEY AUTOINCREMENT, alloc_key INTEGER NOT NULL, job_id INTEGER,
  name TEXT NOT NULL, state TEXT NOT NULL, launcher_pid INTEGER,
  reason TEXT NOT NULL DEFAULT '', updated_s REAL NOT NULL);
CREATE TABLE transitions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, entity TEXT NOT NULL,
  key TEXT NOT NULL, src TEXT, dst TEXT NOT NULL, reason TEXT NOT NULL);
CREATE INDEX transitions_key ON transitions(entity, key);
""" + usage_sql.TABLES
