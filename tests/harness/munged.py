"""A private munged for tests that authenticate with munge (as the munge user)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

KEY = Path("/etc/munge/munge.key")


@contextmanager
def private_munged() -> Iterator[Path]:
    """Start munged on a socket of its own; yield the socket path."""
    if os.geteuid() != 0 or shutil.which("munged") is None or not KEY.exists():
        pytest.skip("needs root, munged and /etc/munge/munge.key")
    import pwd

    munge = pwd.getpwnam("munge")
    run = Path(tempfile.mkdtemp(prefix="weave-munge-", dir="/tmp"))
    os.chmod(run, 0o755)
    os.chown(run, munge.pw_uid, munge.pw_gid)
    sock = run / "munge.socket.2"
    argv = ["munged", f"--socket={sock}", f"--pid-file={run}/munged.pid",
            f"--log-file={run}/munged.log", f"--seed-file={run}/munged.seed"]
    subprocess.run(["setpriv", f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}",
                    "--clear-groups", *argv], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield sock
    finally:
        pid = run / "munged.pid"
        if pid.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid.read_text().strip()), 15)
        shutil.rmtree(run, ignore_errors=True)
