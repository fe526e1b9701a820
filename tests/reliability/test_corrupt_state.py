"""Corrupted or truncated state: weaved refuses its SQLite file with one clear line, and a
node's segment store keeps what is intact and drops what is torn, never serving bad bytes.

weaved is run as `weave daemon` through the CLI boundary (run_app), as a user runs it.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.scratch import shm_dir
from tests.harness.waits import wait_for
from tests.harness.weaved import call, pings
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import StateError

#: `weave daemon` through the same CLI boundary (run_app) without importing every
#: subcommand (the full `weave` app imports torch: ~4 s of CPU per start on this machine)
WEAVE_DAEMON = ("import sys, typer; from weave_slurm.cli.error_lines import run_app; "
                "from weave_slurm.cli.daemon_cmd import daemon; "
                "app = typer.Typer(pretty_exceptions_enable=False); app.command('daemon')(daemon); "
                "app.command('version')(lambda: None); sys.exit(run_app(app, 'weave'))")


def _daemon_run(state: Path) -> tuple[int | None, str, list[dict[str, object]] | None]:
    """`weave daemon` on ``state`` as a subprocess: (exit code or None if it served,
    stderr, the job rows it served)."""
    proc = subprocess.Popen([sys.executable, "-c", WEAVE_DAEMON, "daemon", "--state-dir",
                             str(state), "--tick-s", "0.1", "--node-command",
                             "sleep infinity"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    sock = state / "weaved.sock"
    rows = None
    try:
        wait_for(lambda: proc.poll() is not None or pings(sock), 30,
                 "weave daemon serving or exited")
        if proc.poll() is None:
            rows = call(sock, Op.STATUS, all=True)["jobs"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    return (None if rows is not None else proc.returncode), err, rows


def _populated(state: Path) -> Path:
    """A state dir whose store holds a few jobs (written by a real Weaved)."""
    w = Weaved(DaemonConfig(state_dir=state, tick_s=0.1, node_command=("sleep", "infinity")))
    for i in range(5):
        w.api.submit(0, job_spec_toml(f"c{i}"), "c.toml")
    w.server.server_close()
    w.store.close()
    w._lock.release()
    return state / "weaved.db"


def _truncate(db: Path, rng: random.Random) -> None:
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.truncate(rng.randrange(1, size))


def _scribble(db: Path, rng: random.Random) -> None:
    size = db.stat().st_size
    with db.open("r+b") as f:
        for _ in range(8):  # garbage over pages after the header page
            f.seek(rng.randrange(100, size - 64))
            f.write(rng.randbytes(64))


def _header(db: Path, rng: random.Random) -> None:
    with db.open("r+b") as f:
        f.write(b"this is not an SQLite file at all")


def _wrong_schema(db: Path, rng: random.Random) -> None:
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()


def _foreign_db(db: Path, rng: random.Random) -> None:
    db.unlink()
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE songs (title TEXT)")
    con.commit()
    con.close()


DAMAGES = [(_truncate, 1), (_truncate, 2), (_scribble, 1), (_scribble, 2), (_scribble, 3),
           (_header, 1), (_wrong_schema, 1), (_foreign_db, 1)]


@pytest.mark.parametrize(("damage", "seed"), DAMAGES)
def test_weaved_refuses_a_damaged_store(damage: object, seed: int, public_dir: Path) -> None:
    state = public_dir / "state"
    db = _populated(state)
    for extra in ("weaved.db-wal", "weaved.db-shm"):
        (state / extra).unlink(missing_ok=True)
    assert callable(damage)
    damage(db, random.Random(seed))
    before = db.read_bytes()
    rc, err, rows = _daemon_run(state)
    if rows is not None:
        # SQLite has no page checksums: damage in unused space is invisible, and harmless.
        # Running is right only if every job reads back exactly as it was written.
        got = [(r["job"], r["name"]) for r in rows]
        assert got == [(i + 1, f"c{i}") for i in range(5)], \
            f"weaved served a damaged store ({damage}): {got}"
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc not in (0, None) and len(lines) == 1, err
    assert lines[0].startswith("weave: error: ") and "Traceback" not in err, err
    assert str(db) in lines[0] and ("restore" in lines[0] or "schema" in lines[0]
                                    or "not a weaved" in lines[0]), lines[0]
    assert db.read_bytes() == before, "weaved modified the damaged file"
    assert not (state / "weaved.sock").exists(), "weaved left a socket on bad state"


def test_lost_wal_keeps_committed_jobs(weaved: object, public_dir: Path) -> None:
    """A crash with the WAL intact: what was committed is there after the restart."""
    from tests.daemon.conftest import Running

    assert isinstance(weaved, Running)
    ids = [call(weaved.socket, Op.SUBMIT, spec=job_spec_toml(f"w{i}"))["job"] for i in range(3)]
    # open a second reader while the daemon runs: the store is consistent from outside too
    con = sqlite3.connect(weaved.state_dir / "weaved.db")
    assert [r[0] for r in con.execute("SELECT job_id FROM jobs ORDER BY job_id")] == ids
    assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    con.close()


# -- a node's segment index -------------------------------------------------------------

torch = pytest.importorskip("torch")


def _index_damages(text: str, rng: random.Random) -> list[tuple[str, str]]:
    cut = rng.randrange(1, len(text))
    flip = rng.randrange(len(text))
    return [("truncated", text[:cut]),
            ("empty", ""),
            ("byte flipped", text[:flip] + chr((ord(text[flip]) + 1) % 128) + text[flip + 1:]),
            ("size lies", text.replace('"size_bytes": ', '"size_bytes": 1')),
            ("offset out of range", text.replace('"offset_bytes": 0', '"offset_bytes": 999999')),
            ("incomplete", text.replace('"complete": true', '"complete": false')),
            ("not an object", "[1, 2, 3]"),
            ("wrong format", text.replace('"format": 1', '"format": 7'))]


@pytest.mark.torch
def test_torn_or_corrupt_index_is_never_attached(shm_root: Path) -> None:
    from weave_slurm.node.index import JobRef
    from weave_slurm.node.segments import SegmentStore
    from weave_slurm.node.startup import recover_store

    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    good = {"w": torch.arange(1024, dtype=torch.float32)}
    rng = random.Random(7)
    tried = 0
    for round_ in range(3):
        store.put_state(job, "weights", good, version=3)
        text = store.index_path(job, "weights").read_text()
        for what, bad in _index_damages(text, rng):
            store.put_state(job, "weights", good, version=3)
            store.put_state(job, "optim", good, version=3)
            store.index_path(job, "weights").write_text(bad)
            tried += 1
            try:
                attached = store.attach_state(job, "weights")
            except StateError as exc:
                assert "\n" not in str(exc) and "weights" in str(exc), exc
            else:  # a damage that leaves a valid index must still describe the real bytes
                assert torch.equal(attached.tensors["w"], good["w"]), (round_, what)
                del attached
            report = recover_store(store, {job})
            names = {s.name for s in report.adopted}
            assert "optim" in names, f"{what}: the intact segment was not kept"
            if "weights" in names:  # adopted only if it still reads back exactly
                assert torch.equal(store.attach_state(job, "weights").tensors["w"], good["w"])
            else:
                assert not store.seg_path(job, "weights").exists(), what
    assert tried == 24


@pytest.fixture
def shm_root() -> Iterator[Path]:
    with shm_dir("weave-rel-") as parent:
        yield parent / "weave"
