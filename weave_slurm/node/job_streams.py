"""A hosted job's ``--output``/``--error``: where its resident worker's fds 1 and 2 point
while one of its phases runs.

The worker (``resident``) runs as the job's uid already (the zygote dropped privileges
before it served anything), so the files are opened here, by that uid, never by root:
``O_WRONLY|O_APPEND|O_CREAT``, mode 0644, as sbatch does. The paths come resolved and
absolute with each ``run`` request (weaved: ``daemon/job_output.hosted_paths``; the
runtime: ``MemberSpec.code``), so every phase on whichever node appends to the same
files. A job naming one file gets both streams there (as sbatch's ``--output`` without
``--error``); one naming neither keeps writing to ``resident.log``, as do the worker's
own lines between phases. A file the uid cannot open fails the phase with
:class:`~weave_slurm.errors.ConfigError` naming the path: no silent fallback.

While a phase runs, ``sys.stdout`` is line-buffered, so the job's lines land whole and
in time order with weaved's own event lines in the same file (those are stamped
``<time> weave job N (name): ...``; the job's lines are written as it printed them).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

from weave_slurm.errors import ConfigError

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOCTTY


def paths(output: object, error: object) -> tuple[str | None, str | None]:
    """``(stdout's file, stderr's file)`` of a request's ``output``/``error`` (each an
    absolute path or None): one named file takes both streams."""
    for key, value in (("output", output), ("error", error)):
        if value is not None and not (isinstance(value, str) and os.path.isabs(value)):
            raise ConfigError(f"{key!r} must be an absolute path or null, got {value!r}")
    out = output if isinstance(output, str) else None
    err = error if isinstance(error, str) else None
    return out or err, err or out


def open_append(path: str, what: str) -> int:
    """``path`` opened for appending by this process's uid; ConfigError naming it."""
    try:
        return os.open(path, _FLAGS, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot open the job's {what} file {path} as uid {os.getuid()}: "
                          f"{exc.strerror or exc}") from None


class JobStreams:
    """fds 1 and 2 pointed at the job's files by :meth:`redirect`, back by :meth:`restore`."""

    def __init__(self) -> None:
        self._saved: dict[int, int] = {}
        self._line_buffered: bool | None = None

    def redirect(self, output: object, error: object) -> None:
        out, err = paths(output, error)
        opened: dict[str, int] = {}
        try:
            for path, what in ((out, "--output"), (err, "--error")):
                if path is not None and path not in opened:
                    opened[path] = open_append(path, what)
        except ConfigError:
            for fd in opened.values():
                os.close(fd)
            raise
        if not opened:
            return
        _flush()
        for stream, path in ((1, out), (2, err)):
            if path is not None:
                self._saved[stream] = os.dup(stream)
                os.dup2(opened[path], stream)
        for fd in opened.values():
            os.close(fd)
        if isinstance(sys.stdout, io.TextIOWrapper):
            self._line_buffered = sys.stdout.line_buffering
            sys.stdout.reconfigure(line_buffering=True)

    def restore(self) -> None:
        if not self._saved:
            return
        _flush()
        for stream, fd in self._saved.items():
            os.dup2(fd, stream)
            os.close(fd)
        self._saved.clear()
        if self._line_buffered is not None and isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(line_buffering=self._line_buffered)
        self._line_buffered = None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
