"""The store's usage tables (schema 3): their SQL, how a window is booked, their rows.

``usage`` holds each job's totals so far (added to by every booked window: written as
the job runs, never only at its end); ``usage_marks`` says, per group, up to when its
allocations are booked, whether it is booked to its end (``closed``), and what it held
while no member was in it. Only :class:`~weave_slurm.daemon.store.Store` calls these,
inside its own transactions.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from weave_slurm.daemon.records import UsageMark, UsageRow

TABLES = """
CREATE TABLE usage (
  job_id INTEGER PRIMARY KEY, group_id INTEGER, rollout_gpu_s REAL NOT NULL DEFAULT 0,
  train_gpu_s REAL NOT NULL DEFAULT 0, rollout_node_s REAL NOT NULL DEFAULT 0,
  train_node_s REAL NOT NULL DEFAULT 0, rollout_s REAL NOT NULL DEFAULT 0,
  sync_s REAL NOT NULL DEFAULT 0, train_s REAL NOT NULL DEFAULT 0,
  cost REAL NOT NULL DEFAULT 0, alloc_ids TEXT NOT NULL DEFAULT '[]', updated_s REAL NOT NULL);
CREATE TABLE usage_marks (
  group_id INTEGER PRIMARY KEY, until_s REAL NOT NULL, closed INTEGER NOT NULL DEFAULT 0,
  rollout_gpu_s REAL NOT NULL DEFAULT 0, train_gpu_s REAL NOT NULL DEFAULT 0,
  cost REAL NOT NULL DEFAULT 0);
"""

_ADD = ("UPDATE usage SET rollout_gpu_s=rollout_gpu_s+?, train_gpu_s=train_gpu_s+?, "
        "rollout_node_s=rollout_node_s+?, train_node_s=train_node_s+?, rollout_s=rollout_s+?, "
        "sync_s=sync_s+?, train_s=train_s+?, cost=cost+?, alloc_ids=?, "
        "group_id=COALESCE(?, group_id), updated_s=? WHERE job_id=?")


def statements() -> list[str]:
    """The CREATE statements of :data:`TABLES`, one by one (for a migration)."""
    return [s for s in TABLES.split(";") if s.strip()]


def slurm_order(alloc_id: str) -> tuple[int, str]:
    """Slurm job ids in numeric order (anything else after them)."""
    return (int(alloc_id), "") if alloc_id.isdigit() else (1 << 62, alloc_id)


def book(db: sqlite3.Connection, rows: Sequence[UsageRow], marks: Sequence[UsageMark]) -> None:
    """Add each row's increments to its job's totals; set each group's mark."""
    for u in rows:
        old = db.execute("SELECT alloc_ids FROM usage WHERE job_id=?", (u.job_id,)).fetchone()
        ids = sorted({*json.loads(old[0] if old else "[]"), *u.alloc_ids}, key=slurm_order)
        db.execute("INSERT INTO usage (job_id, group_id, updated_s) VALUES (?, ?, ?) "
                   "ON CONFLICT(job_id) DO NOTHING", (u.job_id, u.group_id, u.updated_s))
        db.execute(_ADD, (u.gpu_s.get("rollout", 0.0), u.gpu_s.get("train", 0.0),
                          u.node_s.get("rollout", 0.0), u.node_s.get("train", 0.0),
                          u.phase_s.get("rollout", 0.0), u.phase_s.get("sync", 0.0),
                          u.phase_s.get("train", 0.0), u.cost, json.dumps(ids), u.group_id,
                          u.updated_s, u.job_id))
    for m in marks:
        db.execute("INSERT OR REPLACE INTO usage_marks VALUES (?, ?, ?, ?, ?, ?)",
                   (m.group_id, m.until_s, int(m.closed), m.idle_gpu_s.get("rollout", 0.0),
                    m.idle_gpu_s.get("train", 0.0), m.idle_cost))


def usage_row(r: sqlite3.Row) -> UsageRow:
    ids = json.loads(r["alloc_ids"])
    if not isinstance(ids, list):
        raise ValueError(f"usage.alloc_ids is {type(ids).__name__}, not a list")
    return UsageRow(r["job_id"], r["group_id"],
                    {"rollout": float(r["rollout_gpu_s"]), "train": float(r["train_gpu_s"])},
                    {"rollout": float(r["rollout_node_s"]), "train": float(r["train_node_s"])},
                    {"rollout": float(r["rollout_s"]), "sync": float(r["sync_s"]),
                     "train": float(r["train_s"])},
                    float(r["cost"]), tuple(str(a) for a in ids), float(r["updated_s"]))


def mark_row(r: sqlite3.Row) -> UsageMark:
    return UsageMark(r["group_id"], float(r["until_s"]), bool(r["closed"]),
                     {"rollout": float(r["rollout_gpu_s"]), "train": float(r["train_gpu_s"])},
                     float(r["cost"]))
