"""What a job's user can reach on this host: the paths its workers need, checked as them.

A job's workers run as its uid, in its ``workdir``, with its ``python`` (or the node's
interpreter) and its ``pythonpath``: each must exist and be readable and executable
(a directory: searchable) *by that uid*, or the job fails at run time on a node
("No module named 'my_pkg'", "No module named 'getpass'"). Both doors refuse such a
job at submission, in one line naming the key and the value:

- ``weave-sbatch`` runs as the submitting user, so it asks the kernel directly
  (``os.stat`` and ``os.access`` in its own process: :func:`probe`).
- weaved runs as root and checks again with the caller's uid (SO_PEERCRED): it forks a
  child that drops for good to the credentials the job's workers get (that uid, its
  primary gid, no supplementary groups: ``node/zygote.py``, ``become``) and asks the
  kernel there. Not by comparing mode bits and owners
  along the path: that would re-implement the kernel's decision and get it wrong
  wherever the kernel knows more (ACLs, supplementary groups, NFS root squash, an
  LSM); the child's answer is the one the job's workers get, on every file system the
  login host shares with the nodes. A weaved that is not root cannot become another
  uid (and its node daemons could not run that uid's workers either): it checks only
  its own uid's jobs.

:func:`output_needs` adds the job's ``--output``/``--error`` files: each must be
appendable, or creatable in its directory, by that uid.

:func:`worker_needs` says what to check: the spec's code paths, and the interpreter
the workers run with (the job's ``python``, else the node interpreter) with the
directories a worker imports from lazily, as the job's uid (the standard library of
the node interpreter, the installed ``weave_slurm`` package).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import pwd
import select
import signal
import socket
import stat
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.config.job import SHOWN_CHARS, JobSpec, user_dirs
from weave_slurm.config.launch import DEFAULT_OUTPUT
from weave_slurm.config.sbatch import host_path, log_path
from weave_slurm.errors import ConfigError
from weave_slurm.node.zygotes import weave_package_dir

#: How long weaved waits for its checking child (a hung network mount must not hang
#: the submission; the job is refused, with that reason).
PROBE_TIMEOUT_S = 10.0

#: What a probe of a path found: 0 (usable), a positive errno, or one of these.
NOT_A_FILE = -1
NOT_A_DIR = -2


class Kind(enum.Enum):
    """What a path must be for the workers."""

    PROGRAM = "program"       # a file they can read and execute (an interpreter)
    DIR = "dir"               # a directory they can list and search
    LOG = "log"               # a file they can append to, or create in its directory


@dataclass(frozen=True)
class Need:
    """One path the job's workers need, and the words of its refusal."""

    key: str        # the spec key ('python', 'pythonpath[0]') or what the path is
    path: str
    kind: Kind
    site: bool = False        # the site's path (node interpreter...), not the spec's


def worker_needs(job: JobSpec, node_python: str | None) -> list[Need]:
    """What the job's workers must reach as its uid; ``node_python``: the interpreter
    the node daemons fork default workers from (None: not known here)."""
    out = [Need(key, value, Kind.DIR) for key, value in _dirs(job)]
    if job.slurm.container is not None:   # its python is the image's (node/containers.py)
        return out
    if job.python is not None:
        out.append(Need("python", job.python, Kind.PROGRAM))
    elif node_python is not None:
        out.append(Need("the node interpreter", node_python, Kind.PROGRAM, site=True))
        if node_python == sys.executable:     # ours: its library is known
            out.append(Need("the node interpreter's standard library",
                            sysconfig.get_path("stdlib"), Kind.DIR, site=True))
    if job.python is not None or node_python is not None:
        out.append(Need("weave's installed package", weave_package_dir(), Kind.DIR,
                        site=True))
    return out


def output_needs(job: JobSpec, uid: int | None = None) -> list[Need]:
    """The job's ``--output`` (default ``weave-%j.out``) and ``--error`` files
    (``[slurm]``), which its workers or processes open as ``uid`` (None: this
    process's): checked at submission, not first when the job runs. Patterns are filled
    in as at run time (``%j`` with a stand-in id: it names the file, not its directory);
    a relative name is in ``workdir``, else the user's home."""
    home = None
    if job.workdir is None:
        with contextlib.suppress(KeyError):
            home = pwd.getpwuid(os.geteuid() if uid is None else uid).pw_dir
    user = _name(uid)
    out = []
    for key, pattern in (("slurm.output", job.slurm.output or DEFAULT_OUTPUT),
                         ("slurm.error", job.slurm.error)):
        if pattern:
            path = host_path(log_path(pattern, job_id=0, user=user, job_name=job.name,
                                      workdir=job.workdir or home), socket.gethostname())
            out.append(Need(key, path, Kind.LOG))
    return out


def unshared_outputs(job: JobSpec, uid: int, roots: Sequence[Path]) -> list[str]:
    """A line for each of the job's output files outside ``uid``'s home and the site's
    shared ``roots``: the hosts that write it (weaved, each node) may each have their
    own copy of that directory, and the user another (said at submission, not lost)."""
    allowed = user_dirs(uid, roots)
    out = []
    for need in output_needs(job, uid):
        real = Path(os.path.realpath(os.path.dirname(need.path)))
        if not any(real == d or d in real.parents for d in allowed):
            out.append(f"{need.key} {need.path[:SHOWN_CHARS]!r} is outside your home and "
                       f"this site's shared roots ({', '.join(map(str, allowed)) or 'none'}):"
                       " the nodes may not share that directory, so the file may be "
                       "written where you do not look; give -o or -D under one of them")
    return out


def _dirs(job: JobSpec) -> list[tuple[str, str]]:
    out = [("workdir", job.workdir)] if job.workdir is not None else []
    return out + [(f"pythonpath[{i}]", p) for i, p in enumerate(job.pythonpath)]


def check_access(job: JobSpec, needs: Sequence[Need], uid: int | None = None) -> None:
    """Refuse (ConfigError, one line) a job whose ``uid`` (None: this process's) cannot
    reach what its workers need."""
    if not needs:
        return
    found = probe(needs, uid)
    if found is None:
        return      # cannot become that uid here: see the module doc
    for need, code in zip(needs, found, strict=True):
        if code != 0:
            raise ConfigError(refusal(job, need, code, _name(uid)))


def refusal(job: JobSpec, need: Need, code: int, user: str) -> str:
    """The one line saying why ``user`` cannot use ``need``."""
    if need.site:
        return (f"{job.source}: user {user} cannot use {need.key} "
                f"{need.path[:SHOWN_CHARS]!r} "
                f"({_why(need, code)}); the job's workers would fail importing modules "
                "as you (e.g. \"No module named 'getpass'\"): set 'python' to an "
                "interpreter of your own that has torch (docs/job_api.md, 'Your own "
                "code'), or ask the site admin to make it readable")
    return f"{job.source}: key '{need.key}' = {need.path[:SHOWN_CHARS]!r}: {_why(need, code)}"


def _why(need: Need, code: int) -> str:
    if need.kind is Kind.LOG:
        if code == NOT_A_FILE:
            return "is not a file"
        if code in (errno.ENOENT, errno.ENOTDIR):
            return "its directory does not exist"
        if code == errno.EACCES:
            return "you cannot write it, or create it in its directory"
    what = "a file" if need.kind is Kind.PROGRAM else "a directory"
    if code in (NOT_A_FILE, NOT_A_DIR):
        return f"is not {what}"
    if code in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    if code == errno.ETIMEDOUT:
        return f"could not be checked in {PROBE_TIMEOUT_S:g} s (a hung file system?)"
    verb = "read and execute" if need.kind is Kind.PROGRAM else "list and search"
    return f"you cannot {verb} it ({os.strerror(code)})"


def _name(uid: int | None) -> str:
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# -- asking the kernel ------------------------------------------------------------------

def probe(needs: Sequence[Need], uid: int | None = None) -> list[int] | None:
    """One code per need (0 = usable), as ``uid`` sees it; None if this process cannot
    become ``uid``."""
    if uid is None or uid == os.geteuid():
        return [probe_one(n.path, n.kind) for n in needs]
    if os.geteuid() != 0:
        return None
    return _probe_as(uid, needs)


def probe_one(path: str, kind: Kind) -> int:
    """In the process whose view counts: 0, an errno, NOT_A_FILE or NOT_A_DIR."""
    if kind is Kind.LOG:
        return _probe_log(path)
    try:
        st = os.stat(path)      # follows symlinks: a venv's python is one
    except OSError as exc:
        return exc.errno or errno.EIO
    if kind is Kind.PROGRAM and not stat.S_ISREG(st.st_mode):
        return NOT_A_FILE
    if kind is Kind.DIR and not stat.S_ISDIR(st.st_mode):
        return NOT_A_DIR
    return 0 if os.access(path, os.R_OK | os.X_OK) else errno.EACCES


def _probe_log(path: str) -> int:
    """A log file: appendable if it exists, else creatable in its directory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        try:
            if not stat.S_ISDIR(os.stat(parent).st_mode):
                return errno.ENOTDIR
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0 if os.access(parent, os.W_OK | os.X_OK) else errno.EACCES
    except OSError as exc:
        return exc.errno or errno.EIO
    if not stat.S_ISREG(st.st_mode):
        return NOT_A_FILE
    return 0 if os.access(path, os.W_OK) else errno.EACCES


def _probe_as(uid: int, needs: Sequence[Need]) -> list[int]:
    """Fork, drop to the workers' credentials for ``uid`` for good, probe, report the
    codes on a pipe.

    The child runs only ``setgroups``/``setresgid``/``setresuid``, ``stat``/``access``
    and one ``write`` (no lock another thread of weaved may hold: no logging, no I/O
    buffers, no imports), then ``_exit``.
    """
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = uid      # as node/segments.py gid_of: the workers' gid
    items = [(n.path, n.kind) for n in needs]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover (the child; its report is what the tests check)
        code = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() == (uid, uid, uid):
                os.write(write_fd, ",".join(str(probe_one(p, k)) for p, k in items).encode())
                code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data = _read_all(read_fd, PROBE_TIMEOUT_S)
    finally:
        os.close(read_fd)
    if data is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        threading.Thread(target=_reap, args=(pid,), daemon=True).start()
        return [errno.ETIMEDOUT] * len(needs)
    _reap(pid)
    codes = [int(c) for c in data.decode().split(",")] if data else []
    if len(codes) != len(needs):
        return [errno.EPERM] * len(needs)     # the child could not become the user
    return codes


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """Everything until end of stream; None if that took longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
