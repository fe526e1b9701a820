"""The cluster's munge daemons: the login side's, and one on each separate host.

The login side runs a private munged with its own socket (the system one only if
that fails; see docs/slurm.md). A separate host runs its own munged as the munge
user, in its namespaces, on the same socket path (private to the host: its /run
and the state dir are its own there) with a copy of the same key, as on a site.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from weave_slurm.errors import StateError
from weave_slurm.slurm import daemons
from weave_slurm.slurm.cluster_config import MUNGE_RUN_DIR, ClusterPaths
from weave_slurm.slurm.command_runner import CommandRunner, SlurmCommandError
from weave_slurm.slurm.host_plan import HostPlan, NodeHost, as_user, host_argv

log = logging.getLogger(__name__)

SYSTEM_MUNGE_DIR = Path("/run/munge")
SOCKET_NAME = "munge.socket.2"

Wait = Callable[[str, Callable[[], bool], Callable[[], bool], float, Callable[[], str]], None]


def munge_ok(runner: CommandRunner, sock: Path | None,
             wrap: Callable[[Sequence[str]], list[str]] = list) -> bool:
    """True when a credential can be made on ``sock`` (None: the default socket)."""
    argv = ["munge", "-n"] + ([f"--socket={sock}"] if sock else [])
    try:
        return runner.run(wrap(argv), timeout_s=5, check=False).returncode == 0
    except SlurmCommandError:
        return False


def host_munged_argv(munge_dir: Path) -> list[str]:
    """munged of a separate host, all its files in its private ``munge_dir``."""
    d = munge_dir
    return ["munged", "-F", f"--socket={d / SOCKET_NAME}", f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}"]


def start_login_munge(paths: ClusterPaths, runner: CommandRunner, wait: Wait,
                      timeout_s: float) -> Path | None:
    """A private munged for the login side; the system one if that cannot start.

    Returns the private socket, or None when the system munged is used.
    """
    d = paths.munge_dir
    d.mkdir(parents=True, exist_ok=True)
    if d.parent == MUNGE_RUN_DIR:
        MUNGE_RUN_DIR.chmod(0o755)
    shutil.chown(d, "munge", "munge")
    d.chmod(0o755)  # munged wants the socket dir searchable by all
    sock = paths.munge_socket
    rec = daemons.start("munged", ["munged", "-F", f"--socket={sock}",
                                   f"--pid-file={d / 'munged.pid'}",
                                   f"--log-file={d / 'munged.log'}",
                                   f"--seed-file={d / 'munged.seed'}"],
                        pid_file=paths.pid_file("munged"),
                        log_file=paths.log_dir / "munged.out", user="munge")
    try:
        wait("private munged", lambda: munge_ok(runner, sock),
             lambda: daemons.is_alive(rec), min(timeout_s, 10.0),
             lambda: daemons.log_tail(paths.log_dir / "munged.out"))
        return sock
    except StateError as exc:
        log.warning("private munged failed (%s); using the system munged", exc)
        daemons.stop(rec)
        paths.pid_file("munged").unlink(missing_ok=True)
    if not munge_ok(runner, None):
        SYSTEM_MUNGE_DIR.mkdir(parents=True, exist_ok=True)
        shutil.chown(SYSTEM_MUNGE_DIR, "munge", "munge")
        sysrec = daemons.start("munged-system", ["munged", "-F"],
                               pid_file=paths.pid_file("munged-system"),
                               log_file=paths.log_dir / "munged-system.out", user="munge")
        wait("system munged", lambda: munge_ok(runner, None),
             lambda: daemons.is_alive(sysrec), min(timeout_s, 10.0),
             lambda: daemons.log_tail(paths.log_dir / "munged-system.out"))
    return None


def host_munge_dir(paths: ClusterPaths, private: bool) -> Path:
    """Where a separate host's munged lives: the login's socket path, private to the host.

    ``private`` False: the login side uses the system munged, so slurm.conf names no
    socket and every host's munged sits at the default ``/run/munge``.
    """
    return paths.munge_dir if private else SYSTEM_MUNGE_DIR


def start_host_munge(plan: HostPlan, paths: ClusterPaths, munge_dir: Path,
                     runner: CommandRunner, wait: Wait,
                     timeout_s: float) -> list[daemons.DaemonRecord]:
    """Start every host's munged (as the munge user, in its namespaces); wait for each."""
    records = [daemons.start(f"munged-{n.name}",
                             host_argv(n, as_user("munge", host_munged_argv(munge_dir))),
                             pid_file=paths.pid_file(f"munged-{n.name}"),
                             log_file=paths.log_dir / f"munged-{n.name}.out")
               for n in plan.nodes]
    for node, rec in zip(plan.nodes, records, strict=True):
        _wait_host(node, rec, paths, munge_dir / SOCKET_NAME, runner, wait, timeout_s)
    return records


def _wait_host(node: NodeHost, rec: daemons.DaemonRecord, paths: ClusterPaths, sock: Path,
               runner: CommandRunner, wait: Wait, timeout_s: float) -> None:
    def wrap(argv: Sequence[str]) -> list[str]:
        return host_argv(node, argv)

    wait(f"munged on {node.name}", lambda: munge_ok(runner, sock, wrap),
         lambda: daemons.is_alive(rec), min(timeout_s, 10.0),
         lambda: daemons.log_tail(paths.log_dir / f"munged-{node.name}.out"))
