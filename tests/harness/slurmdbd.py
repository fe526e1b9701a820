"""A real Slurm accounting database for tests: MariaDB and slurmdbd from Debian's
packages, with a private munged.

slurmdbd and sacctmgr (22.05) authenticate with munge's default socket
(``/run/munge/munge.socket.2``) whatever ``AuthInfo`` says, so both run in a mount
namespace of their own where ``/run`` is private and ``/run/munge`` is the private
munged's directory (:meth:`Accounting.run`); nothing of the machine's /run changes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.fleet import free_port
from tests.harness.munged import private_munged

CLUSTER = "wtest"
NEEDS = ("mariadbd", "mariadb-install-db", "slurmdbd", "sacctmgr", "unshare")


@dataclass
class AccountingDb:
    """A running slurmdbd; :meth:`run` runs a command where it can reach it."""

    conf: Path          # the slurm.conf that names it (SLURM_CONF)
    munge_dir: Path

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` in a private mount namespace whose /run/munge is the test's munged."""
        script = (f"mount -t tmpfs none /run && mkdir /run/munge && mount --bind "
                  f"{self.munge_dir} /run/munge && exec \"$@\"")
        return ["unshare", "-m", "sh", "-c", script, "sh", *argv]

    def run(self, argv: Sequence[str], timeout_s: float = 60.0) -> str:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        done = subprocess.run(self.argv(argv), env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: "
                                 f"{done.stderr[-2000:]}")
        return done.stdout


def _wait(what: str, ready: Path, log: Path, timeout_s: float = 30.0,
          said: str | None = None) -> None:
    """Until ``ready`` exists (and ``log`` has ``said``)."""
    deadline = time.monotonic() + timeout_s
    while not ready.exists() or (said is not None and said not in log.read_text()):
        if time.monotonic() > deadline:
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            raise AssertionError(f"{what} did not start in {timeout_s:g} s: {tail}")
        time.sleep(0.1)


@contextlib.contextmanager
def accounting_db() -> Iterator[AccountingDb]:
    """MariaDB (its own data dir and port) and slurmdbd; both stopped at the end."""
    if os.geteuid() != 0 or any(shutil.which(c) is None for c in NEEDS):
        pytest.skip(f"needs root and {', '.join(NEEDS)} (Debian: mariadb-server slurmdbd)")
    top = Path(tempfile.mkdtemp(prefix="wdbd-", dir="/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with private_munged() as sock:
            data, sql_port, dbd_port = top / "data", free_port(), free_port()
            subprocess.run(["mariadb-install-db", f"--datadir={data}", "--user=root",
                            "--auth-root-authentication-method=normal"], check=True,
                           capture_output=True, timeout=120)
            procs.append(subprocess.Popen(
                ["mariadbd", f"--datadir={data}", f"--socket={top}/my.sock",
                 f"--port={sql_port}", "--bind-address=127.0.0.1", "--user=root",
                 "--skip-grant-tables", f"--pid-file={top}/my.pid",
                 f"--log-error={top}/my.err"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
            _wait("mariadbd", top / "my.pid", top / "my.err")
            conf = top / "slurm.conf"
            conf.write_text(
                f"ClusterName={CLUSTER}\nSlurmctldHost=localhost\nAuthType=auth/munge\n"
                "AccountingStorageType=accounting_storage/slurmdbd\n"
                f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={dbd_port}\n"
                "NodeName=n0 CPUs=1\nPartitionName=p Nodes=n0\n")
            dbd = top / "slurmdbd.conf"   # beside slurm.conf: where slurmdbd looks
            dbd.write_text(
                f"AuthType=auth/munge\nDbdHost=localhost\nDbdAddr=127.0.0.1\n"
                f"DbdPort={dbd_port}\nSlurmUser=root\nLogFile={top}/slurmdbd.log\n"
                f"PidFile={top}/slurmdbd.pid\nStorageType=accounting_storage/mysql\n"
                f"StorageHost=127.0.0.1\nStoragePort={sql_port}\nStorageUser=root\n"
                "StorageLoc=slurm_acct_db\n")
            dbd.chmod(0o600)
            db = AccountingDb(conf, sock.parent)
            procs.append(subprocess.Popen(db.argv(["slurmdbd", "-D"]),
                                          env={**os.environ, "SLURM_CONF": str(conf)},
                                          stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            _wait("slurmdbd", top / "slurmdbd.log", top / "slurmdbd.log", 60.0,
                  said="started")
            yield db
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(top, ignore_errors=True)
