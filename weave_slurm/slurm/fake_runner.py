"""A scripted command runner for unit tests that refuses unknown commands.

Register the commands a test expects with :meth:`FakeRunner.on` (matched by argv
prefix, most specific first); any other command raises :class:`UnexpectedCommand`,
so a test cannot silently depend on an unscripted Slurm call (after submitit's
fake ``sacct``/``sbatch`` runner). Every call is recorded in ``calls``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from weave_slurm.errors import WeaveError
from weave_slurm.slurm.command_runner import (
    DEFAULT_TIMEOUT_S,
    BackgroundProcess,
    CommandResult,
    PipedProcess,
    SlurmCommandError,
)


class UnexpectedCommand(WeaveError):
    """The code under test ran a command the test did not script."""


@dataclass(frozen=True)
class FakeCall:
    """One recorded call: its argv, its env overlay and whether it was spawned."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    spawned: bool


@dataclass(frozen=True)
class FakeReply:
    """What a scripted command answers."""

    stdout: str = ""
    stderr: str = ""
    returncode: int = 0
    hang: bool = False
    exited: int | None = None  # spawned: the process has already exited with this code


Responder = FakeReply | Callable[[tuple[str, ...]], FakeReply]


@dataclass
class FakeProcess:
    """A background process that finishes with ``returncode`` when told to."""

    pid: int
    returncode: int | None = None
    signals: list[int] = field(default_factory=list)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise SlurmCommandError(["fake-wait"], None, "", "", timed_out=True,
                                    timeout_s=timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig

    def kill(self) -> None:
        self.send_signal(9)


@dataclass
class FakePipedProcess(FakeProcess):
    """A piped step: what the caller writes is kept; ``stdout`` says what was scripted."""

    stdin: IO[bytes] | None = field(default_factory=io.BytesIO)
    stdout: IO[bytes] | None = field(default_factory=io.BytesIO)


class FakeRunner:
    """Answers only scripted commands; records every call."""

    def __init__(self) -> None:
        self._script: list[tuple[tuple[str, ...], Responder]] = []
        self.calls: list[FakeCall] = []
        self.processes: list[FakeProcess] = []

    def on(self, prefix: Sequence[str], reply: Responder) -> None:
        """Answer every command whose argv starts with ``prefix`` with ``reply``."""
        self._script.append((tuple(prefix), reply))
        self._script.sort(key=lambda item: -len(item[0]))

    def _reply(self, argv: tuple[str, ...]) -> FakeReply:
        for prefix, reply in self._script:
            if argv[:len(prefix)] == prefix:
                return reply(argv) if callable(reply) else reply
        known = sorted({" ".join(p) for p, _ in self._script})
        raise UnexpectedCommand(f"fake runner: unscripted command {' '.join(argv)!r}; "
                                f"scripted prefixes: {known}")

    def run(self, argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
            env: Mapping[str, str] | None = None, check: bool = True) -> CommandResult:
        args = tuple(str(a) for a in argv)
        self.calls.append(FakeCall(args, dict(env or {}), spawned=False))
        reply = self._reply(args)
        if reply.hang:
            raise SlurmCommandError(args, None, reply.stdout, reply.stderr, timed_out=True,
                                    timeout_s=timeout_s)
        if check and reply.returncode != 0:
            raise SlurmCommandError(args, reply.returncode, reply.stdout, reply.stderr)
        return CommandResult(args, reply.returncode, reply.stdout, reply.stderr)

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log_path: Path | None = None) -> BackgroundProcess:
        args = tuple(str(a) for a in argv)
        self.calls.append(FakeCall(args, dict(env or {}), spawned=True))
        reply = self._reply(args)
        proc = FakeProcess(pid=100_000 + len(self.processes), returncode=reply.exited)
        self.processes.append(proc)
        return proc

    def spawn_piped(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    log_path: Path | None = None) -> PipedProcess:
        args = tuple(str(a) for a in argv)
        self.calls.append(FakeCall(args, dict(env or {}), spawned=True))
        reply = self._reply(args)
        proc = FakePipedProcess(pid=100_000 + len(self.processes),
                                stdout=io.BytesIO(reply.stdout.encode()))
        self.processes.append(proc)
        return proc

    def argvs(self, program: str | None = None) -> list[tuple[str, ...]]:
        """The argv of every recorded call, optionally only those of ``program``."""
        return [c.argv for c in self.calls if program is None or c.argv[0] == program]
