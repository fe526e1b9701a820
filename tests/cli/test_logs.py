"""Logging is set up once, by the entry point, and its INFO lines really show."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from weave_slurm.cli.logs import setup_logging


def test_setup_logging_emits_info_with_the_prog(root_logger: logging.Logger,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging(logging.INFO, "weave-node")
    logging.getLogger("weave_slurm.node.daemon").info("node daemon on %s", "/dev/shm/x")
    logging.getLogger("weave_slurm.node.daemon").debug("not shown")
    assert capsys.readouterr().err == \
        "weave-node INFO weave_slurm.node.daemon: node daemon on /dev/shm/x\n"


def test_a_second_call_replaces_its_own_handler_only(root_logger: logging.Logger,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    others = list(root_logger.handlers)
    setup_logging(logging.INFO, "a")
    setup_logging(logging.WARNING, "b", timestamps=True)
    assert [h.get_name() for h in root_logger.handlers if h not in others] == ["weave-cli"]
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    err = capsys.readouterr().err
    assert err.endswith(" b WARNING x: shown\n") and "hidden" not in err


def test_no_library_module_configures_logging() -> None:
    """Only the CLI entry points (weave_slurm/cli) and the sync/ subprocess mains do."""
    pkg = Path(__file__).resolve().parents[2] / "weave_slurm"
    offenders = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
                 if "basicConfig(" in p.read_text() and p.parts[-2] not in ("cli", "sync")]
    assert offenders == []
    cli = [p.name for p in (pkg / "cli").glob("*.py") if "basicConfig(" in p.read_text()]
    assert cli == []


@pytest.mark.torch
def test_weave_node_serve_verbose_logs_info(tmp_path: Path) -> None:
    """The node daemon's start-up INFO line reaches stderr (it never did: issue 13)."""
    shm = Path(tempfile.mkdtemp(prefix="weave-test-", dir="/dev/shm"))
    argv = [sys.executable, "-m", "weave_slurm.cli.node", "serve", "--host-mem-gib", "0.01",
            "--root", str(shm / "weave"), "--checkpoint-root", str(tmp_path / "ckpt"),
            "--checkpoint-interval-s", "0", "--no-resident", "--verbose"]
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while "INFO" not in err.read_text() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        text = err.read_text()
        assert "weave-node INFO weave_slurm.node.daemon: node daemon on" in text, text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(shm, ignore_errors=True)
