"""The daemon's state: one SQLite file (WAL, ``synchronous=FULL``).

Every state change is a compare-and-set on the entity's row plus a row in
``transitions``, committed in one transaction BEFORE the action it records: an
``ALLOCATING`` row is durable before ``sbatch`` runs, so a restarted daemon knows
the call may have happened and looks for it in Slurm before asking again.
A file that is not a database, fails ``quick_check`` or has another schema
version raises :class:`StateError`: the daemon never runs on state it cannot read.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from weave_slurm.config.job import JobSpec
from weave_slurm.config.job_codec import spec_from_json, spec_to_json
from weave_slurm.daemon import usage_sql
from weave_slurm.daemon.records import (
    AllocRow,
    GroupPlan,
    GroupRow,
    JobRow,
    StepRow,
    TransitionRow,
    UsageMark,
    UsageRow,
    profile_from_json,
    profile_to_json,
)
from weave_slurm.daemon.states import (
    AllocState,
    GroupState,
    JobState,
    State,
    StepRunState,
    check_transition,
    state_of,
)
from weave_slurm.daemon.store_file import open_file
from weave_slurm.errors import StalePlacement, StateError
from weave_slurm.model.profile import JobProfile

#: entity -> (table, key column, state enum)
_ENTITIES: dict[str, tuple[str, str, type[State]]] = {
    "job": ("jobs", "job_id", JobState),
    "group": ("groups", "group_id", GroupState),
    "alloc": ("allocations", "key", AllocState),
    "step": ("steps", "key", StepRunState),
}
_FIELDS = {"jobs": {"reason", "group_id", "started_s", "ended_s", "moving_from",
                    "weights_sha256", "held"},
           "groups": {"reason", "plan"},
           "allocations": {"reason", "alloc_id", "nodes", "updated_s", "gone"},
           "steps": {"reason", "launcher_pid", "updated_s"}}



def _given_back(text: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``allocations.gone`` (JSON ``[[node, given back at], ...]``) as the row's nodes
    given back and when."""
    pairs = [(str(n), float(t)) for n, t in json.loads(text)]
    return tuple(n for n, _ in pairs), tuple(t for _, t in pairs)

def _parse_state(kind: type[State], value: str) -> State:
    if kind is JobState:
        return state_of(JobState, value)
    if kind is GroupState:
        return state_of(GroupState, value)
    if kind is AllocState:
        return state_of(AllocState, value)
    return state_of(StepRunState, value)


class Store:
    """One SQLite file; thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), isolation_level=None,
                                   check_same_thread=False, timeout=10.0)
        self._db.row_factory = sqlite3.Row
        try:
            self._open()
        except BaseException as exc:
            self._db.close()
            if not isinstance(exc, sqlite3.DatabaseError | UnicodeDecodeError):
                raise  # StateError from the checks, or a bug
            raise StateError(f"state database {str(path)!r} is unreadable or corrupt ({exc}); "
                             "the daemon will not run on it: restore a backup or move it "
                             "away to start afresh") from exc

    def _open(self) -> None:
        """Check, create or migrate the file (``daemon/store_file.py``), reading every
        row through its parser."""
        open_file(self._db, self.path, self._tx, (
            ("jobs", "job_id", self._job), ("groups", "group_id", self._group),
            ("allocations", "key", self._alloc), ("steps", "key", self._step),
            ("transitions", "id", lambda r: tuple(r)),
            ("usage", "job_id", usage_sql.usage_row),
            ("usage_marks", "group_id", usage_sql.mark_row)))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the store for a run of reads, or of writes, that the other threads of this
        process must see whole (a status read beside a job's leaving: its group's plan
        and its state change in two writes). Another process sees each write commit."""
        with self._lock:
            yield

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- transitions -------------------------------------------------------------------

    def _log(self, db: sqlite3.Connection, now: float, entity: str, key: object,
             src: State | None, dst: State, reason: str) -> None:
        db.execute("INSERT INTO transitions (ts, entity, key, src, dst, reason) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
                   (now, entity, str(key), src.value if src else None, dst.value, reason))

    def transition(self, entity: str, key: int, dst: State, reason: str, now: float, *,
                   expect: State | Sequence[State] | None = None, **fields: Any) -> State:
        """Move ``entity`` ``key`` to ``dst`` (and set ``fields``) if the edge is legal.

        ``expect``: the state(s) the caller read; StateError if it changed meanwhile
        (a compare-and-set). Returns the state it came from.
        """
        table, col, kind = _ENTITIES[entity]
        bad = set(fields) - _FIELDS[table]
        if bad:
            raise StateError(f"store: cannot set {sorted(bad)} on {table}")
        with self._tx() as db:
            row = db.execute(f"SELECT state FROM {table} WHERE {col}=?", (key,)).fetchone()
            if row is None:
                raise StateError(f"{entity} {key} does not exist")
            src = _parse_state(kind, row[0])
            wanted = (expect,) if isinstance(expect, (JobState, GroupState, AllocState,
                                                       StepRunState)) else expect
            if wanted is not None and src not in wanted:
                raise StateError(f"{entity} {key} is {src.value}, not "
                                 f"{'/'.join(s.value for s in wanted)}; it changed meanwhile")
            check_transition(src, dst)
            sets = ", ".join(f"{k}=?" for k in ("state", *fields))
            db.execute(f"UPDATE {table} SET {sets} WHERE {col}=?",
                       (dst.value, *fields.values(), key))
            self._log(db, now, entity, key, src, dst, reason)
        return src

    def update(self, entity: str, key: int, **fields: Any) -> None:
        """Set non-state fields (a reason, a plan) without a transition."""
        table, col, _ = _ENTITIES[entity]
        bad = set(fields) - _FIELDS[table]
        if bad or not fields:
            raise StateError(f"store: cannot set {sorted(bad) or 'nothing'} on {table}")
        with self._tx() as db:
            db.execute(f"UPDATE {table} SET {', '.join(f'{k}=?' for k in fields)} "
                       f"WHERE {col}=?", (*fields.values(), key))

    def transitions(self, entity: str, key: int) -> list[TransitionRow]:
        return [TransitionRow(r["ts"], r["entity"], r["key"], r["src"], r["dst"], r["reason"])
                for r in self._rows("SELECT * FROM transitions WHERE entity=? AND key=? "
                                    "ORDER BY id", (entity, str(key)))]

    def requeued(self) -> dict[int, list[TransitionRow]]:
        """Each requeued job's requeues (its RUNNING -> PENDING transitions, oldest
        first), in one read: what ``weave status`` and ``weave show job`` keep visible."""
        out: dict[int, list[TransitionRow]] = {}
        for r in self._rows("SELECT * FROM transitions WHERE entity='job' AND src=? AND "
                            "dst=? ORDER BY id", (JobState.RUNNING.value,
                                                  JobState.PENDING.value)):
            out.setdefault(int(r["key"]), []).append(TransitionRow(
                r["ts"], r["entity"], r["key"], r["src"], r["dst"], r["reason"]))
        return out

    # -- jobs --------------------------------------------------------------------------

    def add_job(self, *, uid: int, user: str, name: str, spec: JobSpec, spec_toml: str,
                source: str, profile: JobProfile, now: float) -> int:
        """Insert a PENDING job (one transaction): ``spec`` as parsed at submission, and
        ``spec_toml``, the text it was parsed from; returns its id."""
        return self.add_jobs(uid=uid, user=user, name=name, specs=lambda first: [spec],
                             spec_toml=spec_toml, source=source, profile=profile, now=now)[0]

    def add_jobs(self, *, uid: int, user: str, name: str,
                 specs: Callable[[int], Sequence[JobSpec]], spec_toml: str, source: str,
                 profile: JobProfile, now: float) -> list[int]:
        """Insert PENDING jobs in one transaction (the elements of an array): ``specs``,
        given the first one's id, says each one's spec; returns their ids."""
        with self._tx() as db:
            ids: list[int] = []
            sql = ("INSERT INTO jobs (uid, user, name, spec, spec_json, source, profile, "
                   "state, submitted_s, held) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            first = int(db.execute(sql, (uid, user, name, spec_toml, None, source,
                                         profile_to_json(profile), JobState.PENDING.value,
                                         now, 0)).lastrowid or 0)
            for i, spec in enumerate(specs(first)):
                if i == 0:
                    db.execute("UPDATE jobs SET spec_json=?, held=? WHERE job_id=?",
                               (spec_to_json(spec), int(spec.slurm.hold), first))
                    job_id = first
                else:
                    job_id = int(db.execute(sql, (
                        uid, user, name, spec_toml, spec_to_json(spec), source,
                        profile_to_json(profile), JobState.PENDING.value, now,
                        int(spec.slurm.hold))).lastrowid or 0)
                ids.append(job_id)
                self._log(db, now, "job", job_id, None, JobState.PENDING,
                          f"submitted by uid {uid}")
        return ids

    @staticmethod
    def _job(r: sqlite3.Row) -> JobRow:
        typed = None if r["spec_json"] is None else spec_from_json(r["spec_json"])
        return JobRow(r["job_id"], r["uid"], r["user"], r["name"], typed, r["spec"],
                      r["source"], profile_from_json(r["profile"]),
                      state_of(JobState, r["state"]), r["reason"], r["group_id"],
                      r["submitted_s"], r["started_s"], r["ended_s"],
                      profile_from_json(r["measured"]) if r["measured"] else None,
                      r["moving_from"], r["weights_sha256"], bool(r["held"]),
                      r["recoveries"])

    def update_job(self, job_id: int, *, spec: JobSpec, profile: JobProfile, reason: str,
                   now: float, expect: Sequence[JobState]) -> None:
        """Change what a job asked for (``weave update``: its name, SLO, time limit) while
        it is in one of ``expect``; logged as a transition to the state it is in."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            if row is None:
                raise StateError(f"job {job_id} does not exist")
            state = state_of(JobState, row[0])
            if state not in expect:
                raise StateError(f"job {job_id} is {state.value} now; it changed meanwhile")
            db.execute("UPDATE jobs SET name=?, spec_json=?, profile=? WHERE job_id=?",
                       (spec.name, spec_to_json(spec), profile_to_json(profile), job_id))
            self._log(db, now, "job", job_id, state, state, reason)

    def set_measured(self, job_id: int, profile: JobProfile) -> None:
        """Record the runtime's measured planning profile of a job (state unchanged)."""
        with self._tx() as db:
            if db.execute("UPDATE jobs SET measured=? WHERE job_id=?",
                          (profile_to_json(profile), job_id)).rowcount != 1:
                raise StateError(f"job {job_id} does not exist")

    def set_recoveries(self, job_id: int, count: int) -> None:
        """Record how many recoveries a job has had so far (a restarted weaved goes on
        counting from it)."""
        with self._tx() as db:
            if db.execute("UPDATE jobs SET recoveries=? WHERE job_id=?",
                          (count, job_id)).rowcount != 1:
                raise StateError(f"job {job_id} does not exist")

    def job(self, job_id: int) -> JobRow | None:
        rows = self._rows("SELECT * FROM jobs WHERE job_id=?", (job_id,))
        return self._job(rows[0]) if rows else None

    def jobs(self, states: Sequence[JobState] | None = None,
             group_id: int | None = None, moving: bool = False,
             ids: Sequence[int] | None = None) -> list[JobRow]:
        """Jobs in ``states`` (None: any), of ``group_id``; ``moving``: only those a
        re-plan is moving (``moving_from`` set); ``ids``: only these (one query)."""
        sql, args = "SELECT * FROM jobs WHERE 1=1", list[Any]()
        if ids is not None:
            sql += " AND job_id IN (SELECT value FROM json_each(?))"
            args.append(json.dumps(list(ids)))
        if moving:
            sql += " AND moving_from IS NOT NULL"
        if states is not None:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args += [s.value for s in states]
        if group_id is not None:
            sql += " AND group_id=?"
            args.append(group_id)
        return [self._job(r) for r in self._rows(sql + " ORDER BY job_id", args)]

    def jobs_submitted_since(self, since_s: float) -> list[JobRow]:
        """Jobs submitted at or after ``since_s`` (a submission rate limit counts them)."""
        return [self._job(r) for r in self._rows(
            "SELECT * FROM jobs WHERE submitted_s >= ? ORDER BY job_id", (since_s,))]

    def counts(self) -> dict[str, list[tuple[Any, ...]]]:
        """Rows by state, one grouped query per table (for metrics): ``jobs`` and
        ``groups`` as (state, count); ``allocations`` as (role, partition, state,
        count, nodes)."""
        sql = {"jobs": "SELECT state, COUNT(*) FROM jobs GROUP BY state",
               "groups": "SELECT state, COUNT(*) FROM groups GROUP BY state",
               "allocations": "SELECT role, partition, state, COUNT(*), "
                              "SUM(node_count - json_array_length(gone)) "
                              "FROM allocations GROUP BY role, partition, state"}
        return {table: [tuple(r) for r in self._rows(q)] for table, q in sql.items()}

    # -- groups ------------------------------------------------------------------------

    def add_group(self, group_id: int, label: str, plan: GroupPlan, now: float,
                  reason: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO groups (group_id, label, state, plan, created_s) "
                       "VALUES (?, ?, ?, ?, ?)",
                       (group_id, label, GroupState.FORMING.value, plan.to_json(), now))
            self._log(db, now, "group", group_id, None, GroupState.FORMING, reason)

    def next_group_id(self) -> int:
        rows = self._rows("SELECT MAX(group_id) FROM groups")
        return int(rows[0][0] or 0) + 1

    @staticmethod
    def _group(r: sqlite3.Row) -> GroupRow:
        return GroupRow(r["group_id"], r["label"], state_of(GroupState, r["state"]),
                        GroupPlan.from_json(r["plan"]), r["created_s"], r["reason"])

    def group(self, group_id: int) -> GroupRow | None:
        rows = self._rows("SELECT * FROM groups WHERE group_id=?", (group_id,))
        return self._group(rows[0]) if rows else None

    def groups(self, live_only: bool = True) -> list[GroupRow]:
        sql = "SELECT * FROM groups"
        if live_only:
            sql += f" WHERE state != '{GroupState.RELEASED.value}'"
        return [self._group(r) for r in self._rows(sql + " ORDER BY group_id")]

    # -- allocations -------------------------------------------------------------------

    def add_alloc(self, *, group_id: int, role: str, pool: str, partition: str,
                  node_count: int, gpus_per_node: int, gpu_type: str | None,
                  cpus_per_node: int, now: float, reason: str, account: str | None = None,
                  qos: str | None = None, time_limit_min: int | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO allocations (group_id, role, pool, partition, node_count, "
                "gpus_per_node, gpu_type, cpus_per_node, state, updated_s, account, qos, "
                "time_limit_min) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (group_id, role, pool, partition, node_count, gpus_per_node, gpu_type,
                 cpus_per_node, AllocState.WANTED.value, now, account, qos, time_limit_min))
            key = int(cur.lastrowid or 0)
            self._log(db, now, "alloc", key, None, AllocState.WANTED, reason)
        return key

    @staticmethod
    def _alloc(r: sqlite3.Row) -> AllocRow:
        return AllocRow(r["key"], r["group_id"], r["role"], r["pool"], r["partition"],
                        r["node_count"], r["gpus_per_node"], r["gpu_type"], r["cpus_per_node"],
                        state_of(AllocState, r["state"]), r["alloc_id"],
                        tuple(json.loads(r["nodes"])), r["reason"], r["account"], r["qos"],
                        r["time_limit_min"], *_given_back(r["gone"]))

    def allocs(self, group_id: int | None = None, live_only: bool = True) -> list[AllocRow]:
        sql, args = "SELECT * FROM allocations WHERE 1=1", []
        if group_id is not None:
            sql += " AND group_id=?"
            args.append(group_id)
        rows = [self._alloc(r) for r in self._rows(sql + " ORDER BY key", args)]
        return [a for a in rows if not (live_only and a.state.final)]

    # -- steps -------------------------------------------------------------------------

    def add_step(self, *, alloc_key: int, job_id: int | None, name: str, now: float,
                 reason: str) -> int:
        """A LAUNCHING step row: the intent, written before the launch call."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO steps (alloc_key, job_id, name, state, updated_s) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (alloc_key, job_id, name, StepRunState.LAUNCHING.value, now))
            key = int(cur.lastrowid or 0)
            self._log(db, now, "step", key, None, StepRunState.LAUNCHING, reason)
        return key

    @staticmethod
    def _step(r: sqlite3.Row) -> StepRow:
        return StepRow(r["key"], r["alloc_key"], r["job_id"], r["name"],
                       state_of(StepRunState, r["state"]), r["launcher_pid"], r["reason"])

    def steps(self, *, alloc_key: int | None = None, job_id: int | None = None,
              live_only: bool = True) -> list[StepRow]:
        sql, args = "SELECT * FROM steps WHERE 1=1", []
        if alloc_key is not None:
            sql += " AND alloc_key=?"
            args.append(alloc_key)
        if job_id is not None:
            sql += " AND job_id=?"
            args.append(job_id)
        if live_only:
            sql += f" AND state != '{StepRunState.ENDED.value}'"
        return [self._step(r) for r in self._rows(sql + " ORDER BY key", args)]

    # -- usage records (daemon/usage_meter.py) ------------------------------------------------

    def book_usage(self, rows: Sequence[UsageRow], marks: Sequence[UsageMark]) -> None:
        """Add ``rows`` (increments) to the jobs' usage and set the groups' marks, in one
        transaction: a window is booked whole or not at all."""
        with self._tx() as db:
            usage_sql.book(db, rows, marks)

    def usage(self) -> dict[int, UsageRow]:
        """Every job's usage record, by job id."""
        return {r["job_id"]: usage_sql.usage_row(r) for r in self._rows("SELECT * FROM usage")}

    def usage_marks(self) -> dict[int, UsageMark]:
        return {r["group_id"]: usage_sql.mark_row(r)
                for r in self._rows("SELECT * FROM usage_marks")}

    # -- placement (one transaction) ---------------------------------------------------

    def commit_moves(self, groups: Sequence[tuple[int, str, GroupPlan, bool]],
                     moves: Sequence[tuple[int, int, int, str]], now: float) -> None:
        """Write a re-plan atomically: new/changed group plans (as for
        :meth:`commit_placement`) and each moved RUNNING job's new group, with the group
        it is moving from (``moves``: job id, from group, to group, reason)."""
        with self._tx() as db:
            self._write_plans(db, groups, now)
            self._move(db, moves, now)

    def _move(self, db: sqlite3.Connection, moves: Sequence[tuple[int, int, int, str]],
              now: float) -> None:
        for job_id, src, dst, reason in moves:
            if db.execute("UPDATE jobs SET group_id=?, moving_from=?, reason=? "
                          "WHERE job_id=? AND state=? AND group_id=?",
                          (dst, src, reason, job_id, JobState.RUNNING.value,
                           src)).rowcount != 1:
                raise StateError(f"job {job_id} is no longer RUNNING in group {src}; "
                                 "the re-plan is dropped")
            self._log(db, now, "job", job_id, JobState.RUNNING, JobState.RUNNING, reason)

    def withdraw_move(self, job_id: int, src: int, dst: int, dst_plan: GroupPlan,
                      reason: str, now: float, src_plan: GroupPlan | None = None) -> None:
        """Take back a move that has not started: the RUNNING job belongs to ``src``
        again (it kept its place there), ``dst`` gets ``dst_plan`` and ``src``
        ``src_plan`` (None: its plan as it is), atomically."""
        with self._tx() as db:
            if db.execute("UPDATE jobs SET group_id=?, moving_from=NULL, reason=? "
                          "WHERE job_id=? AND state=? AND group_id=? AND moving_from=?",
                          (src, reason, job_id, JobState.RUNNING.value, dst,
                           src)).rowcount != 1:
                raise StateError(f"job {job_id} is no longer moving from group {src} to "
                                 f"group {dst}; nothing to withdraw")
            db.execute("UPDATE groups SET plan=? WHERE group_id=?", (dst_plan.to_json(), dst))
            if src_plan is not None:
                db.execute("UPDATE groups SET plan=? WHERE group_id=?",
                           (src_plan.to_json(), src))
            self._log(db, now, "job", job_id, JobState.RUNNING, JobState.RUNNING, reason)

    def _write_plans(self, db: sqlite3.Connection,
                     groups: Sequence[tuple[int, str, GroupPlan, bool]], now: float) -> None:
        for gid, label, plan, is_new in groups:
            if is_new:
                db.execute("INSERT INTO groups (group_id, label, state, plan, created_s) "
                           "VALUES (?, ?, ?, ?, ?)",
                           (gid, label, GroupState.FORMING.value, plan.to_json(), now))
                self._log(db, now, "group", gid, None, GroupState.FORMING,
                          f"new group for job(s) {list(plan.job_ids)}")
            else:
                db.execute("UPDATE groups SET plan=? WHERE group_id=?", (plan.to_json(), gid))

    def commit_placement(self, groups: Sequence[tuple[int, str, GroupPlan, bool]],
                         placed: Sequence[tuple[int, int, str]], now: float,
                         moves: Sequence[tuple[int, int, int, str]] = ()) -> None:
        """Write new/changed group plans and move jobs PENDING -> PLACED, atomically.

        ``groups``: (group id, label, plan, is_new); ``placed``: (job id, group id, reason);
        ``moves``: running jobs re-placed with them (as :meth:`commit_moves`).
        StalePlacement (nothing written) if one of them is no longer PENDING; StateError
        (nothing written) if a moved one is no longer RUNNING where it was.
        """
        with self._tx() as db:
            ids = [job_id for job_id, _, _ in placed]
            gone = [(r[0], r[1]) for r in db.execute(
                f"SELECT job_id, state FROM jobs WHERE job_id IN ({','.join('?' * len(ids))})"
                " AND state != ?", (*ids, JobState.PENDING.value))]
            if gone:     # cancelled while placement decided: write none of it
                raise StalePlacement(", ".join(f"job {j} is {s} now" for j, s in gone))
            self._write_plans(db, groups, now)
            for job_id, gid, reason in placed:
                row = db.execute("SELECT state FROM jobs WHERE job_id=?", (job_id,)).fetchone()
                src = state_of(JobState, row[0])
                check_transition(src, JobState.PLACED)
                db.execute("UPDATE jobs SET state=?, group_id=?, reason='' WHERE job_id=?",
                           (JobState.PLACED.value, gid, job_id))
                self._log(db, now, "job", job_id, src, JobState.PLACED, reason)
            self._move(db, moves, now)
