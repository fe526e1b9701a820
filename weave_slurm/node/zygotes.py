"""The daemon side of a zygote: which interpreter it runs, as whom, and its process.

A worker forked from a zygote runs the zygote's interpreter, so a job that names its
own ``python`` gets workers from a zygote of that interpreter (:class:`Interpreter`):

- the node daemon's own interpreter (``Interpreter()``): today's zygote, started as
  the node daemon (root on a site), forks the workers of every job that names no
  ``python`` and drops each to its job's uid;
- a job's own ``python``: the user's code (its ``site-packages``, ``.pth`` files and
  ``sitecustomize`` run when it starts), so its zygote runs as that job's uid from the
  start, never as root, and forks workers of that uid only: one zygote per
  interpreter and uid, reused by every job of that user that names that interpreter.

A job's interpreter imports weave from the node daemon's installation: the zygote's
``PYTHONPATH`` is a directory holding only a ``weave_slurm`` link to the installed
package (not its whole ``site-packages``, whose torch, built for another Python,
would shadow the environment's own). The environment must have weave's runtime
dependencies, torch (same major version) first (docs/job_api.md, "Your own code").
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import weave_slurm
from weave_slurm.node.seqpacket import receive, send

log = logging.getLogger(__name__)

#: Lines of a job zygote's stderr kept for the message when it cannot start.
TAIL_LINES = 8


def weave_package_dir() -> str:
    """The directory of the installed ``weave_slurm`` package (symlinks resolved)."""
    return str(Path(weave_slurm.__file__).resolve().parent)


@dataclass(frozen=True)
class Interpreter:
    """What a zygote runs: ``python`` (None: the node daemon's own) as ``uid`` (None:
    as the node daemon)."""

    python: str | None = None
    uid: int | None = None

    @classmethod
    def of(cls, python: str | None, uid: int) -> Interpreter:
        """The zygote a job of ``uid`` naming ``python`` (None: none) needs."""
        if python is None or os.path.normpath(python) == os.path.normpath(sys.executable):
            return cls()
        return cls(os.path.normpath(python), uid)

    @property
    def own(self) -> bool:
        """A job's own interpreter (not the node daemon's)."""
        return self.python is not None

    def words(self) -> str:
        if self.python is None:
            return "the node daemon's interpreter"
        return f"{self.python} (as uid {self.uid})"


def link_dir(root: Path) -> Path:
    """``<root>/pylib``: a directory every uid can read, holding only a ``weave_slurm``
    link to the installed package (a job interpreter's zygote's ``PYTHONPATH``)."""
    pylib = root / "pylib"
    pylib.mkdir(mode=0o755, exist_ok=True)
    os.chmod(pylib, 0o755)
    link, target = pylib / "weave_slurm", weave_package_dir()
    if not link.is_symlink() or os.readlink(link) != target:
        tmp = pylib / f".weave_slurm.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    return pylib


def _gid_of(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


class ZygoteProcess:
    """One zygote: its process, its control socket and a thread reading it.

    ``on_message(z, msg)`` is called for each message, ``on_gone(z)`` once at its end
    of stream (both from the reader thread). A job interpreter's zygote keeps its
    last stderr lines (:attr:`tail`), for the message when it cannot start.
    """

    def __init__(self, key: Interpreter, root: Path,
                 on_message: Callable[[ZygoteProcess, dict[str, Any]], None],
                 on_gone: Callable[[ZygoteProcess], None]) -> None:
        self.key = key
        self.root = root
        self.ready = False
        self.was_ready = False
        self.restarts: list[float] = []
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._on_message, self._on_gone = on_message, on_gone
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._stderr: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> None:
        """Start the process (it imports torch in the background; does not wait).
        OSError: it could not be started (e.g. the interpreter is not there)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.key.python or sys.executable, "-m", "weave_slurm.node.zygote",
                str(theirs.fileno())]
        try:
            self._proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),),
                                          stdin=subprocess.DEVNULL, **self._how())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ctl = ours
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        if self._proc.stderr is not None:
            self._stderr = threading.Thread(target=self._read_stderr,
                                            args=(self._proc.stderr,),
                                            name="zygote-stderr", daemon=True)
            self._stderr.start()

    def _how(self) -> dict[str, Any]:
        """Popen's arguments: a job interpreter runs as its uid, importing weave from
        the link directory, in ``/`` (not the node daemon's working directory)."""
        if not self.key.own:
            return {}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PYTHONPATH"] = str(link_dir(self.root))
        env["PYTHONSAFEPATH"] = "1"     # no working directory on sys.path (3.11+)
        how: dict[str, Any] = {"env": env, "cwd": "/", "stderr": subprocess.PIPE}
        uid = self.key.uid
        if uid is not None and uid != os.geteuid():
            how.update(user=uid, group=_gid_of(uid), extra_groups=[])
        return how

    def send(self, msg: dict[str, Any], fds: list[int]) -> None:
        if self._ctl is None:
            raise OSError("the zygote was never started")
        send(self._ctl, msg, fds)

    def _read(self) -> None:
        ctl = self._ctl
        while ctl is not None:
            try:
                msg, fds = receive(ctl)
            except OSError:
                msg, fds = None, []
            for fd in fds:
                os.close(fd)
            if msg is None:
                self._on_gone(self)
                return
            self._on_message(self, msg)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        """Forward a job zygote's stderr to the node daemon's, keeping its last lines."""
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"zygote {self.key.words()}: {line}\n")
        stream.close()

    def exit_status(self, timeout_s: float = 2.0) -> int | None:
        """Its exit status once it ended (its stderr read to the end), waiting at most
        ``timeout_s``; None if it still runs."""
        if self._proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout_s)
        if self._stderr is not None:
            self._stderr.join(timeout_s)
        return self._proc.poll()

    def last_words(self) -> str:
        """The last line of its stderr that says something (e.g. the import error)."""
        lines = [t.strip() for t in self.tail if t.strip()]
        return f": {lines[-1][:200]}" if lines else ""

    def stop(self) -> None:
        """End its stream: it kills its workers and exits (reaped in the background)."""
        if self._ctl is not None:
            with contextlib.suppress(OSError):
                self._ctl.shutdown(socket.SHUT_RDWR)
        proc = self._proc
        if proc is not None:
            threading.Thread(target=_reap, args=(proc,), daemon=True).start()

    def wait(self, timeout_s: float) -> None:
        """Wait for the process to exit; SIGKILL it after ``timeout_s``."""
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        if self._ctl is not None:
            self._ctl.close()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
