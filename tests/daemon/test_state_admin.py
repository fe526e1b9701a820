"""``weave state backup`` and ``weave state migrate`` on a real SQLite state database."""

from __future__ import annotations

import sqlite3
import stat
import threading
from pathlib import Path

import pytest
from filelock import FileLock

from tests.harness.old_store import make_old
from tests.harness.specs import stored
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.daemon.schema import SCHEMA_VERSION
from weave_slurm.daemon.state_admin import backup, migrate, schema_version
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError, StateError
from weave_slurm.model.profile import simple_profile


def _store(state: Path, jobs: int = 3) -> Store:
    state.mkdir(parents=True, exist_ok=True)
    store = Store(state / "weaved.db")
    for i in range(jobs):
        store.add_job(uid=1000, user="alice", name=f"j{i}", **stored(f"j{i}"),
                      source="a.toml", profile=simple_profile(f"j{i}", 10, 10, 1.5),
                      now=float(i))
    return store


def _jobs(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
    finally:
        con.close()


def test_an_online_backup_is_consistent_while_the_store_writes(tmp_path: Path) -> None:
    """The store open and writing (as a running weaved's): each copy holds every row
    committed before it began, passes quick_check and is 0600."""
    state = tmp_path / "state"
    store = _store(state)
    stop = threading.Event()

    def write() -> None:
        i = 100
        while not stop.is_set():
            store.add_job(uid=1000, user="alice", name=f"w{i}", **stored("w"),
                          source="w.toml", profile=simple_profile("w", 10, 10, 1.5),
                          now=float(i))
            i += 1
    writer = threading.Thread(target=write)
    writer.start()
    try:
        copies = []
        for k in range(3):
            before = len(store.jobs())
            copies.append((backup(state, tmp_path / f"b{k}.db"), before))
    finally:
        stop.set()
        writer.join()
    for done, before in copies:
        assert done.schema_version == str(SCHEMA_VERSION)
        assert stat.S_IMODE(done.path.stat().st_mode) == 0o600
        assert _jobs(done.path) >= before
        con = sqlite3.connect(done.path)
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        con.close()
        copy = Store(done.path)   # weaved can run on it
        assert all(j.state is JobState.PENDING for j in copy.jobs())
        copy.close()
    store.close()


def test_backup_refusals_are_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(ConfigError, match=r"--state-dir .*: no weaved.db there"):
        backup(state, tmp_path / "x.db")
    _store(state).close()
    (tmp_path / "taken.db").write_text("mine")
    with pytest.raises(ConfigError, match="exists; give another path or --force"):
        backup(state, tmp_path / "taken.db")
    assert (tmp_path / "taken.db").read_text() == "mine"   # nothing lost
    assert backup(state, tmp_path / "taken.db", force=True).bytes > 0
    with pytest.raises(ConfigError, match="is the database itself"):
        backup(state, state / "weaved.db", force=True)


def _old_file(state: Path) -> Path:
    """What a weaved of schema 2 left behind (the usage tables and charge columns of 3,
    the move column of 4 and the weights' digest of 5 not there yet)."""
    _store(state).close()
    db = state / "weaved.db"
    make_old(db, 2)
    return db


def test_migrate_backs_up_then_migrates_and_refuses_a_running_weaved(tmp_path: Path) -> None:
    state = tmp_path / "state"
    db = _old_file(state)
    assert migrate(state, check_only=True).before == "2" and schema_version(db) == "2"
    lock = FileLock(str(state / "weaved.lock"), thread_local=False)
    lock.acquire()
    try:
        with pytest.raises(StateError, match=r"a weaved holds .*; stop it before migrating"):
            migrate(state)
    finally:
        lock.release()
    assert schema_version(db) == "2"             # refused: untouched
    done = migrate(state)
    assert (done.before, done.after) == ("2", str(SCHEMA_VERSION))
    assert done.backup is not None and done.backup.path == state / "weaved.db.v2.bak"
    assert schema_version(done.backup.path) == "2" and _jobs(done.backup.path) == 3
    assert schema_version(db) == str(SCHEMA_VERSION) and _jobs(db) == 3
    again = migrate(state)
    assert again.backup is None and again.before == str(SCHEMA_VERSION)
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StateError, match="schema version '99'; this weave reads versions"):
        migrate(state)


def test_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    _old_file(state)
    sd = ["--state-dir", str(state)]
    assert run_app(app, "weave", ["state", "migrate", "--check", *sd]) == 0
    assert capsys.readouterr().out.strip() == \
        f"schema version 2: would migrate it to {SCHEMA_VERSION}"
    assert run_app(app, "weave", ["state", "migrate", "--backup", str(tmp_path / "old.db"),
                                  *sd]) == 0
    assert capsys.readouterr().out.strip() == \
        f"migrated schema version 2 -> {SCHEMA_VERSION}; the old file is backed up at " \
        f"{tmp_path / 'old.db'}"
    assert run_app(app, "weave", ["state", "backup", str(tmp_path / "b.db"), *sd]) == 0
    assert f"schema version {SCHEMA_VERSION}" in capsys.readouterr().out
    assert run_app(app, "weave", ["state", "backup", str(tmp_path / "b.db"), *sd]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; give another path or --force" in err[0]
    assert run_app(app, "weave", ["state", "backup", str(tmp_path / "c.db"),
                                  "--state-dir", str(tmp_path / "nowhere")]) == 2
