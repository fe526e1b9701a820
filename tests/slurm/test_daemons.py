"""Daemon pid files: exact identity (pid + start time), SIGTERM then SIGKILL."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from weave_slurm.slurm import daemons


def _start(tmp_path: Path, name: str, code: str) -> daemons.DaemonRecord:
    return daemons.start(name, [sys.executable, "-c", code], pid_file=tmp_path / f"{name}.pid",
                         log_file=tmp_path / f"{name}.log")


def test_record_round_trip_and_stop(tmp_path: Path) -> None:
    rec = _start(tmp_path, "sleeper", "import time; print('up', flush=True); time.sleep(60)")
    assert daemons.read(tmp_path / "sleeper.pid") == rec
    assert daemons.is_alive(rec)
    assert daemons.stop(rec, timeout_s=5)
    assert not daemons.is_alive(rec)
    assert not daemons.stop(rec), "stopping a stopped daemon reports it was not running"


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    rec = _start(tmp_path, "victim", "import time; time.sleep(60)")
    try:
        impostor = replace(rec, start_ticks=rec.start_ticks + 1)  # same pid, other process
        assert not daemons.is_alive(impostor)
        assert not daemons.stop(impostor)
        assert daemons.is_alive(rec), "the real process must survive"
    finally:
        daemons.stop(rec, timeout_s=5)


def test_sigterm_ignorer_gets_sigkill(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    rec = _start(tmp_path, "stubborn", code)
    log = tmp_path / "stubborn.log"
    deadline = time.monotonic() + 20
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline, "child never became ready"
        time.sleep(0.02)
    assert daemons.stop(rec, timeout_s=0.3)
    assert not daemons.is_alive(rec)


def test_unreadable_pid_file_and_log_tail(tmp_path: Path) -> None:
    (tmp_path / "bad.pid").write_text("not json")
    assert daemons.read(tmp_path / "bad.pid") is None
    assert daemons.read(tmp_path / "missing.pid") is None
    (tmp_path / "x.log").write_text("a\nb\nc\n")
    assert daemons.log_tail(tmp_path / "x.log", 2) == "b | c"
    assert daemons.log_tail(tmp_path / "none.log") == "(no log)"
