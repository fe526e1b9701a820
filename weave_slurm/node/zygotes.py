"""The daemon side of a zygote: which interpreter it runs, as whom, and its process.

A worker forked from a zygote runs the zygote's interpreter, so a job that names its
own ``python`` gets workers from a zygote of that interpreter (:class:`Interpreter`):

- the node daemon's own interpreter (``Interpreter()``): today's zygote, started as
  the node daemon (root on a site), forks the workers of every job that names no
  ``python`` and drops each to its job's uid;
- a job's own ``python``: the user's code (its ``site-packages``, ``.pth`` files and
  ``sitecustomize`` run when it starts), so its zygote runs as that job's uid from the
  start, never as root, and forks workers of that uid only: one zygote per
  interpreter and uid, reused by every job of that user that names that interpreter;
- a job's container (``[slurm] container``): the image's ``python3.11`` (or the job's
  ``python`` inside it), started by the site's OCI runtime as the job's uid with the
  job's directories bound in (node/containers.py), connected back over a socket in the
  node's store: one zygote per container, uid and those directories.

A job's interpreter imports weave from the node daemon's installation: the zygote's
``PYTHONPATH`` is a directory holding only a ``weave_slurm`` link to the installed
package (not its whole ``site-packages``, whose torch, built for another Python,
would shadow the environment's own). The environment must have weave's runtime
dependencies, torch (same major version) first (docs/job_api.md, "Your own code").
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import weave_slurm
from weave_slurm.config.oci import oci_conf_path, read_oci_conf
from weave_slurm.errors import ConfigError
from weave_slurm.node import containers
from weave_slurm.node.seqpacket import receive, send

log = logging.getLogger(__name__)

#: Lines of a job zygote's stderr kept for the message when it cannot start.
TAIL_LINES = 8
#: Longest wait for a contained zygote to connect (its runtime starts it first).
CONNECT_TIMEOUT_S = 60.0
ACCEPT_POLL_S = 0.1
_CONTAINED = itertools.count(1)


def weave_package_dir() -> str:
    """The directory of the installed ``weave_slurm`` package (symlinks resolved)."""
    return str(Path(weave_slurm.__file__).resolve().parent)


@dataclass(frozen=True)
class Interpreter:
    """What a zygote runs: ``python`` (None: the node daemon's own) as ``uid`` (None:
    as the node daemon)."""

    python: str | None = None
    uid: int | None = None
    container: str | None = None            # an OCI bundle it runs in (node/containers.py)
    writes: tuple[str, ...] = ()            # ... with these directories bound read-write
    reads: tuple[str, ...] = ()             # ... and these read-only (on its PYTHONPATH)

    @classmethod
    def of(cls, python: str | None, uid: int, container: str | None = None,
           writes: tuple[str, ...] = (), reads: tuple[str, ...] = ()) -> Interpreter:
        """The zygote a job of ``uid`` naming ``python`` (None: none) needs; in
        ``container``, ``python`` is the container's (default: ``python3.X`` of the node
        daemon's version), with the job's directories bound in."""
        if container is not None:
            return cls(python or f"python{sys.version_info[0]}.{sys.version_info[1]}", uid,
                       container, writes, reads)
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
        where = f" in container {self.container}" if self.container else ""
        return f"{self.python}{where} (as uid {self.uid})"


def interpreter_of(request: dict[str, Any], uid: int) -> Interpreter:
    """The zygote an ``activate`` request's job needs: its ``python``, and in its
    ``container`` its working directory, its output files' directories and the node
    daemon's socket directory (read-write) and its ``pythonpath`` (read-only) bound in."""
    python, container = request.get("python"), request.get("container")
    python = python if isinstance(python, str) else None
    if not isinstance(container, str):
        return Interpreter.of(python, uid)
    env = request.get("env")
    env = env if isinstance(env, dict) else {}
    files = [*(request.get(k) for k in ("output", "error")), env.get("WEAVE_NODE_SOCKET")]
    writes = [request.get("workdir"), *(os.path.dirname(f) for f in files if isinstance(f, str))]
    reads = request.get("pythonpath") or []
    return Interpreter.of(python, uid, container,
                          tuple(dict.fromkeys(w for w in writes if isinstance(w, str) and w)),
                          tuple(str(r) for r in reads))


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
        self._launch: containers.Launch | None = None   # in a container: its runtime's

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> None:
        """Start the process (it imports torch in the background; does not wait).
        OSError: it could not be started (e.g. the interpreter is not there)."""
        if self.key.container is not None:
            self._start_contained()
            return
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

    def _start_contained(self) -> None:
        """In the key's container (node/containers.py: the site's RunTimeRun, as the
        job's uid, the host's pids so the pool sees its workers'), connected back over
        a socket in the node's store (no descriptor passes into a container)."""
        key = self.key
        uid = 0 if key.uid is None else key.uid
        conf = read_oci_conf()
        if conf is None:
            raise OSError(f"no OCI runtime configured ({oci_conf_path()} does not exist)")
        if os.geteuid() != 0:
            raise OSError("a container needs a node daemon running as root")
        n = next(_CONTAINED)
        path = self.root / f"zygote-{os.getpid()}-{n}.sock"
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(str(path))
            os.chown(path, uid, _gid_of(uid))
            os.chmod(path, 0o600)
            listener.listen(1)
            names = {"n": os.uname().nodename, "u": str(uid),
                     "j": os.environ.get("SLURM_JOB_ID", "0"), "s": f"zygote{os.getpid()}",
                     "t": str(n)}
            try:
                self._launch = containers.prepare(
                    conf, str(key.container), self.root / f"oci-zygote-{n}",
                    args=[str(key.python), "-m", "weave_slurm.node.zygote", f"unix:{path}"],
                    env={"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONSAFEPATH": "1",
                         "PYTHONPATH": ":".join(key.reads)},
                    workdir="/", uid=uid, gid=_gid_of(uid), groups=[],
                    socket_dir=str(self.root), names=names, writable=key.writes,
                    host_pids=True)
            except ConfigError as exc:
                raise OSError(str(exc)) from None
            self._proc = subprocess.Popen(self._launch.argv, stdin=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True)
        except BaseException:
            listener.close()
            path.unlink(missing_ok=True)
            raise
        threading.Thread(target=self._accept, args=(listener, path), name="zygote-reader",
                         daemon=True).start()
        if self._proc.stderr is not None:
            self._stderr = threading.Thread(target=self._read_stderr,
                                            args=(self._proc.stderr,),
                                            name="zygote-stderr", daemon=True)
            self._stderr.start()

    def _accept(self, listener: socket.socket, path: Path) -> None:
        """The contained zygote's connection (or its end, if it never comes), then read."""
        listener.settimeout(ACCEPT_POLL_S)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        try:
            while True:
                try:
                    conn, _ = listener.accept()
                    break
                except TimeoutError:   # one that could not start ends at once
                    if self.poll() is not None or time.monotonic() > deadline:
                        raise
            conn.settimeout(None)
            self._ctl = conn
        except OSError:
            self._on_gone(self)
            return
        finally:
            listener.close()
            path.unlink(missing_ok=True)
        self._read()

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
            threading.Thread(target=_reap, args=(proc, self._launch), daemon=True).start()

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


def _reap(proc: subprocess.Popen[bytes], launch: containers.Launch | None = None) -> None:
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if launch is not None:
        containers.remove(launch)
