"""weave-sbatch and weave status wait for a weaved that is starting, as Slurm's commands
keep trying slurmctld, and say it is not there, in the same one line, once the wait
(``$WEAVE_DAEMON_WAIT_S``) is over."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness.waits import wait_for
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.client import DEFAULT_WAIT_S, WAIT_ENV, wait_for_daemon_s
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import ConfigError, StateError
from weave_slurm.wire import LineClient, encode, read_line

HINT = "start it with 'weave daemon' or set --socket / WEAVE_DAEMON_SOCKET"


def _serve_one_after(path: Path, delay_s: float) -> threading.Thread:
    """A server whose socket appears only after ``delay_s``, then answers one line."""
    def serve() -> None:
        time.sleep(delay_s)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(path))
            server.listen(1)
            conn, _ = server.accept()
            with conn:
                if read_line(conn, bytearray(), 1 << 16) is not None:
                    conn.sendall(encode({"ok": True, "result": {"served": True}}))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_client_waits_for_a_socket_that_appears(tmp_path: Path) -> None:
    path = tmp_path / "late.sock"
    thread = _serve_one_after(path, 0.4)
    t0 = time.monotonic()
    with LineClient(path, timeout_s=10, wait_s=30) as client:
        assert client.request({"op": "ping"}) == {"served": True}
    assert 0.4 <= time.monotonic() - t0 < 30
    thread.join(10)


def test_without_a_wait_a_missing_socket_fails_at_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(StateError, match=r"no server at .*none.sock.*No such file"):
        LineClient(tmp_path / "none.sock", timeout_s=10)
    assert time.monotonic() - t0 < 0.4


def test_the_wait_comes_from_the_environment() -> None:
    assert wait_for_daemon_s({}) == DEFAULT_WAIT_S == 5.0
    assert wait_for_daemon_s({WAIT_ENV: "0"}) == 0.0
    assert wait_for_daemon_s({WAIT_ENV: " 2.5 "}) == 2.5
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match=rf"WEAVE_DAEMON_WAIT_S='{bad}': must be "
                                              r"seconds >= 0 \(how long"):
            wait_for_daemon_s({WAIT_ENV: bad})


def test_a_bad_wait_is_one_line_and_a_usage_exit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(WAIT_ENV, "soon")
    assert run_app(weave_app, "weave", ["status", "--socket", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == (
        "weave: error: WEAVE_DAEMON_WAIT_S='soon': must be seconds >= 0 (how long to wait "
        "for a weaved that is starting; 0: not at all)\n")


@pytest.mark.parametrize("kind", ["missing", "nobody listening"])
def test_no_weaved_is_the_same_line_after_the_wait(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "weaved.sock"
    if kind == "nobody listening":     # a weaved's socket left behind: ECONNREFUSED
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(sock))
    why = "No such file or directory" if kind == "missing" else "Connection refused"
    monkeypatch.setenv(WAIT_ENV, "0.6")
    t0 = time.monotonic()
    assert run_app(weave_app, "weave", ["status", "--socket", str(sock)]) == 1
    assert time.monotonic() - t0 >= 0.6
    assert capsys.readouterr().err == f"weave: error: no weaved at '{sock}' ({why}); {HINT}\n"


def _has_socket(pid: int) -> bool:
    """The process holds a socket: a client has made its connection's socket (it holds
    no other), so it is connecting, or waiting to."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(FileNotFoundError):   # a descriptor closed meanwhile
        return any(os.readlink(fd).startswith("socket:") for fd in fds.iterdir())
    return False


def test_weave_status_waits_for_weaved_to_listen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    started: list[Weaved] = []

    def start_weaved() -> None:     # after the client has begun
        time.sleep(0.5)
        started.append(Weaved(DaemonConfig(state_dir=state, runtime=DriverKind.IDLE)))
        started[0].run()

    monkeypatch.setenv(WAIT_ENV, "60")
    thread = threading.Thread(target=start_weaved, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        assert run_app(weave_app, "weave", ["status", "--socket",
                                            str(state / "weaved.sock")]) == 0
        assert time.monotonic() - t0 >= 0.5
    finally:
        wait_for(lambda: started, 60, "weaved built")
        started[0].stop()
        thread.join(30)
    assert capsys.readouterr().out.split()[:2] == ["JOBID", "USER"]


def test_weave_sbatch_started_before_weave_daemon_submits(tmp_path: Path) -> None:
    """``weave daemon & weave-sbatch`` the other way round: the client is first, and
    waits (real processes)."""
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("tiny"))
    state = tmp_path / "state"
    env = {**os.environ, WAIT_ENV: "120"}    # a loaded test host may start weaved slowly
    sbatch = subprocess.Popen(
        [sys.executable, "-c", "from weave_slurm.cli.sbatch import main; main()",
         "--test-only", str(spec), "--socket", str(state / "weaved.sock")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: sbatch.poll() is not None or _has_socket(sbatch.pid), 60,
             "weave-sbatch connecting")
    time.sleep(0.3)
    assert sbatch.poll() is None                       # still waiting: no weaved yet
    daemon = subprocess.Popen(
        [sys.executable, "-m", "weave_slurm.cli", "daemon", "--state-dir", str(state),
         "--node-command", "sleep infinity"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out, err = sbatch.communicate(timeout=150)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            assert daemon.wait(30) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)
    assert sbatch.returncode == 0, err
    assert "job 'tiny' would fit this site" in out and "(not submitted)" in out


def test_the_socket_is_found_from_any_directory(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--socket, $WEAVE_DAEMON_SOCKET, a weaved started here, else the site's service
    socket: `cd /tmp && weave status` reaches the service."""
    from weave_slurm.daemon import client

    service = tmp_path / "var-lib-weave" / "weaved.sock"
    monkeypatch.setattr(client, "SERVICE_SOCKET", service)
    monkeypatch.delenv(client.SOCKET_ENV, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert client.default_socket() == client.DEFAULT_STATE_DIR / client.SOCKET_NAME
    service.parent.mkdir()
    service.touch()                                   # the service runs
    assert client.default_socket() == service
    local = elsewhere / ".state" / "weaved" / "weaved.sock"
    local.parent.mkdir(parents=True)
    local.touch()                                     # a weaved started here wins
    assert client.default_socket() == client.DEFAULT_STATE_DIR / client.SOCKET_NAME
    monkeypatch.setenv(client.SOCKET_ENV, "/x.sock")
    assert client.default_socket() == Path("/x.sock")
    assert client.default_socket(Path("/y.sock")) == Path("/y.sock")
