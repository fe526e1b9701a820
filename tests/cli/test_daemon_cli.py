"""``weave daemon``'s service flags: the log file and its rotation, the systemd unit,
and the metrics flags' mistakes (one line, exit code 2)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weave_slurm.cli.daemon_cmd import unit_text
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.logs import file_handler, setup_logging
from weave_slurm.cli.main import app as weave_app


def test_the_log_file_rotates_by_size_and_keeps_its_backups(
        root_logger: logging.Logger, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "weaved.log"
    setup_logging(logging.INFO, "weaved", timestamps=True,
                  to=file_handler(path, 4 / 1024, 2))    # 4 KiB, two old files
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    for i in range(400):
        logging.getLogger("weave_slurm.daemon.reconcile").warning("tick %04d %s", i, "x" * 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["weaved.log", "weaved.log.1", "weaved.log.2"]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    newest = path.read_text().splitlines()[-1]
    assert newest.endswith("weaved WARNING weave_slurm.daemon.reconcile: tick 0399 " + "x" * 40)
    assert "tick 0399" not in (tmp_path / "weaved.log.1").read_text()
    assert capsys.readouterr().err == ""       # to the file instead of stderr


def test_with_size_0_logrotate_rotates_and_weaved_reopens(root_logger: logging.Logger,
                                                           tmp_path: Path) -> None:
    path = tmp_path / "weaved.log"
    handler = file_handler(path, 0, 5)
    assert isinstance(handler, logging.handlers.WatchedFileHandler)
    setup_logging(logging.INFO, "weaved", to=handler)
    log = logging.getLogger("weave_slurm.daemon.service")
    log.warning("before")
    path.rename(tmp_path / "weaved.log.1")         # what logrotate does (no copytruncate)
    log.warning("after")
    assert "before" in (tmp_path / "weaved.log.1").read_text()
    assert path.read_text().strip().endswith("weave_slurm.daemon.service: after")


@pytest.mark.parametrize(("argv", "line"), [
    (["--log-file", "/nonexistent-dir/weaved.log"],
     "weave: error: --log-file '/nonexistent-dir/weaved.log': cannot write it (No such file "
     "or directory)"),
    (["--log-max-mib", "-1", "--log-file", "{tmp}/a.log"],
     "weave: error: --log-max-mib -1.0: must be >= 0 (0: logrotate rotates)"),
    (["--log-backups", "0", "--log-file", "{tmp}/a.log"],
     "weave: error: --log-backups 0: must be >= 1 (old files kept)"),
    (["--metrics-port", "70000"],
     "weave: error: --metrics-port 70000: must be a TCP port (0-65535; 0: any free port)"),
    (["--metrics-port", "many"],
     "weave daemon: error: invalid value 'many' for '--metrics-port': input should be a "
     "valid integer, unable to parse string as an integer"),
])
def test_service_flag_mistakes_are_one_line_and_exit_2(
        argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["daemon", "--state-dir", str(tmp_path / "state"),
            *(a.replace("{tmp}", str(tmp_path)) for a in argv)]
    assert run_app(weave_app, "weave", args) == 2
    assert capsys.readouterr().err == line + "\n"
    assert not (tmp_path / "state").exists()     # refused before weaved started


def test_print_unit_is_the_packaged_unit_for_this_interpreter(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(weave_app, "weave", ["daemon", "--print-unit"]) == 0
    out = capsys.readouterr().out
    assert out == unit_text() and "@PYTHON@" not in out
    lines = out.splitlines()
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={sys.executable} -m weave_slurm.cli daemon ")
    assert os.access(sys.executable, os.X_OK)
    for want in ("User=root", "KillMode=process", "StateDirectory=weave",
                 "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL CAP_DAC_READ_SEARCH",
                 "RestartPreventExitStatus=2", "WantedBy=multi-user.target"):
        assert want in lines, want
    # every flag in ExecStart is one `weave daemon` takes
    flags = [w for line in lines[lines.index(exec_start):] for w in line.split()
             if w.startswith("--")]
    assert run_app(weave_app, "weave", ["daemon", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert flags and all(f in help_text for f in flags), flags



def test_weave_daemon_serves_metrics_and_logs_to_its_file(tmp_path: Path) -> None:
    """The flags reach weaved: a real ``weave daemon`` process, scraped, then stopped."""
    from tests.daemon.test_metrics import scrape, value

    log_file, err = tmp_path / "weaved.log", tmp_path / "stderr"
    argv = [sys.executable, "-m", "weave_slurm.cli", "daemon", "--state-dir",
            str(tmp_path / "state"), "--node-command", "sleep infinity", "--metrics-port",
            "0", "--log-file", str(log_file), "--log-max-mib", "1", "-v"]
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while (m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                              err.read_text())) is None and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert m is not None, err.read_text()
        samples = scrape(int(m.group(1)))
        assert value(samples, "weave_jobs", state="PENDING") == 0
        assert value(samples, "weave_groups", state="ACTIVE") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    logged = log_file.read_text()
    assert "weaved INFO weave_slurm.daemon.service: weaved: serving" in logged, logged
    assert "INFO" not in err.read_text()          # the records went to the file only


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    """Every directive known to this systemd and its ExecStart executable (an unknown key
    or a bad value is a warning on stderr, not an exit code)."""
    unit = tmp_path / "weaved.service"
    unit.write_text(unit_text())
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    unit.write_text(unit_text().replace("KillMode=process", "KillMode=procesz"))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert "Failed to parse kill mode" in res.stderr     # so the check above can fail
