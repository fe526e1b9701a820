"""The one door through which every Slurm (and munge) command runs.

Every call takes an argv list (never a shell string), a timeout and an optional
environment. A non-zero exit raises :class:`SlurmCommandError` carrying argv,
exit code, stdout and stderr; a command still running at its timeout is killed
(its whole process group) and reported as timed out (``returncode is None``).

Background commands (``srun`` steps) are started through :meth:`CommandRunner.spawn`
so that they, too, pass through this door and can be faked in unit tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from weave_slurm.errors import ExternalCommandError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


class SlurmCommandError(ExternalCommandError):
    """A Slurm command failed or hung; carries argv, exit code, stdout and stderr.

    ``timed_out`` is true when the command was killed at its timeout; then
    ``returncode`` is ``None``.
    """

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str,
                 timed_out: bool = False, timeout_s: float | None = None) -> None:
        self.timed_out = timed_out
        what = (f"command timed out after {timeout_s:g} s and was killed" if timed_out
                else "Slurm command failed")
        super().__init__(list(argv), returncode, stdout, stderr, what=what)


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class BackgroundProcess(Protocol):
    """The part of ``subprocess.Popen`` the backends use for background steps."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class PipedProcess(BackgroundProcess, Protocol):
    """A background process whose stdin and stdout are the caller's pipes."""

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def kill(self) -> None: ...


class CommandRunner(Protocol):
    """Runs commands; the real one uses subprocesses, the fake one a script."""

    def run(self, argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
            env: Mapping[str, str] | None = None, check: bool = True) -> CommandResult: ...

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log_path: Path | None = None) -> BackgroundProcess: ...

    def spawn_piped(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    log_path: Path | None = None) -> PipedProcess: ...


def merged_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The calling process's environment overlaid with ``env``."""
    out = dict(os.environ)
    if env:
        out.update(env)
    return out


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_command(argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                env: Mapping[str, str] | None = None, check: bool = True) -> CommandResult:
    """Run ``argv`` to completion and return its output.

    Raises :class:`SlurmCommandError` when the command cannot be started, exits
    non-zero (if ``check``) or is still running after ``timeout_s`` (always).
    """
    args = [str(a) for a in argv]
    if not args:
        raise SlurmCommandError(args, None, "", "empty argv")
    log.debug("run %s (timeout %.1f s)", args, timeout_s)
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=merged_env(env),
                                start_new_session=True)
    except OSError as exc:
        raise SlurmCommandError(args, None, "", f"cannot start {args[0]!r}: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        out, err = proc.communicate()
        raise SlurmCommandError(args, None, _text(out) or _text(exc.stdout),
                                _text(err) or _text(exc.stderr),
                                timed_out=True, timeout_s=timeout_s) from exc
    result = CommandResult(tuple(args), proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise SlurmCommandError(args, proc.returncode, stdout, stderr)
    return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill a hung command and everything it started (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class SubprocessRunner:
    """The real runner: :func:`run_command` for foreground, ``Popen`` for background."""

    def run(self, argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
            env: Mapping[str, str] | None = None, check: bool = True) -> CommandResult:
        return run_command(argv, timeout_s=timeout_s, env=env, check=check)

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log_path: Path | None = None) -> BackgroundProcess:
        args = [str(a) for a in argv]
        log.debug("spawn %s", args)
        sink: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, env=merged_env(env),
                                    start_new_session=True)
        except OSError as exc:
            raise SlurmCommandError(args, None, "", f"cannot start {args[0]!r}: {exc}") from exc
        finally:
            if not isinstance(sink, int):
                sink.close()

    def spawn_piped(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    log_path: Path | None = None) -> PipedProcess:
        """In the background, talking over its stdin and stdout (stderr to ``log_path``)."""
        args = [str(a) for a in argv]
        log.debug("spawn piped %s", args)
        sink: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=sink, env=merged_env(env), start_new_session=True)
        except OSError as exc:
            raise SlurmCommandError(args, None, "", f"cannot start {args[0]!r}: {exc}") from exc
        finally:
            if not isinstance(sink, int):
                sink.close()
