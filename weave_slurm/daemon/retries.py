"""Trying again what failed: doubling, capped waits, a bound for node daemons, and why.

:class:`Backoff` is the one mechanism: per key (an allocation row), how many tries in
a row failed and when the next may start (``RETRY_FIRST_S``, doubling per failure, at
most ``RETRY_MAX_S``). The reconciler keeps one for its allocate calls and one, inside
:class:`NodeDaemonRetries`, for node-daemon steps.

A node-daemon step that ends (or cannot be launched) is launched again after the
backoff, and the jobs of its group say why: the node daemon's own last line from its
step's log and the attempt count. After ``NODE_DAEMON_TRIES`` failures in a row the
verdict is to give up: the reconciler fails the group's jobs with that reason (they
cannot run without the node's daemon, and a daemon that dies at once again and again,
e.g. on a shm root another daemon holds, a bad command or a broken node, needs a person:
a new allocation would most likely land on the same nodes and fail the same way, and
asking for one would hide the error; the failed jobs' reason names it, and their
checkpoints stay for a resubmission). A daemon that ran ``NODE_DAEMON_STABLE_S`` is
healthy again: its next failure counts as the first. Time comes from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weave_slurm.daemon.records import AllocRow

RETRY_FIRST_S = 1.0   # first wait after a failure; doubles per failure in a row
RETRY_MAX_S = 15.0
NODE_DAEMON_TRIES = 5   # node-daemon launches in a row that may fail before its jobs fail
NODE_DAEMON_STABLE_S = 4 * RETRY_MAX_S   # ran this long: healthy, failures forgotten
LOG_TAIL_BYTES = 16384   # how much of a step's log is read for its last line
_SLURM_TOOLS = ("srun:", "slurmstepd:", "sbatch:")


class Backoff:
    """Per key: failures in a row and the earliest time of the next try."""

    def __init__(self, first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> None:
        self.first_s, self.max_s = first_s, max_s
        self._state: dict[int, tuple[int, float]] = {}

    def ready(self, key: int, now: float) -> bool:
        return now >= self._state.get(key, (0, 0.0))[1]

    def failures(self, key: int) -> int:
        return self._state.get(key, (0, 0.0))[0]

    def failed(self, key: int, now: float) -> tuple[int, float]:
        """Count a failure: (failures in a row, seconds to wait before the next try)."""
        n = self.failures(key)
        wait = min(self.max_s, self.first_s * 2 ** n)
        self._state[key] = (n + 1, now + wait)
        return n + 1, wait

    def forget(self, key: int) -> None:
        self._state.pop(key, None)

    def clear(self) -> None:
        self._state.clear()


def in_words(exc: Exception) -> str:
    """A failed backend call in words: a hung command says so."""
    cause = exc.__cause__ or exc
    if getattr(cause, "timed_out", False):
        argv = getattr(cause, "argv", None) or ["command"]
        return f"{Path(argv[0]).name} hung: {str(cause).split(':')[0]}"
    return str(exc)


def last_line(log_path: Path | None, since: int = 0) -> str:
    """The last error line a step's own process wrote to its log after byte ``since``
    (a line saying "error", e.g. ``weave node serve: error: ...`` or a traceback's
    ``StateError: ...``; else its last line): srun's and slurmstepd's own lines
    (``srun: error: h20-0: task 0: Exited with exit code 1``) only if nothing else."""
    if log_path is None:
        return "(no log)"
    try:
        with open(log_path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(since if since <= size else 0, size - LOG_TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        return f"(no log at {log_path})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    own = [line for line in lines if not line.startswith(_SLURM_TOOLS)]
    errors = [line for line in own if "error" in line.lower()]
    return (errors or own or lines or [f"(nothing new in {log_path})"])[-1][:400]


@dataclass(frozen=True)
class Verdict:
    """What a node-daemon failure means for its group's jobs."""

    reason: str      # their REASON
    give_up: bool    # True: fail them with ``reason``


class NodeDaemonRetries:
    """The backoff of node-daemon steps (keyed by allocation row) and what it says."""

    def __init__(self) -> None:
        self.backoff = Backoff()
        self._mark: dict[int, int] = {}   # alloc key -> log size when it was launched
        self._since: dict[int, float] = {}   # alloc key -> when it was launched
        self._said: dict[int, str] = {}   # alloc key -> the reason its jobs were given

    def ready(self, key: int, now: float) -> bool:
        return self.backoff.ready(key, now)

    def failing(self, key: int) -> bool:
        return self.backoff.failures(key) > 0

    def launching(self, key: int, log_path: Path | None, now: float) -> None:
        """A launch starts now: remember when, and where its output starts in the log."""
        self._since[key] = now
        try:
            self._mark[key] = log_path.stat().st_size if log_path else 0
        except OSError:
            self._mark[key] = 0

    def failed(self, alloc: AllocRow, why: str, now: float,
               log_path: Path | None = None) -> Verdict:
        """Count a failure (``why``: "exited with code 1"; with ``log_path``, the
        daemon's last line is added) and say what it means."""
        n, wait = self.backoff.failed(alloc.key, now)
        words = f"{why}: {last_line(log_path, self._mark.get(alloc.key, 0))}" \
            if log_path is not None else why
        what = (f"node daemon of {alloc.role} allocation {alloc.alloc_id} "
                f"({','.join(alloc.nodes) or '?'}) {words}")
        if n >= NODE_DAEMON_TRIES:
            self.forget(alloc.key)
            where = f" (log: {log_path})" if log_path is not None else ""
            return Verdict(f"{what}; gave up after {n} failures in a row{where}", True)
        said = f"{what}; failure {n} of {NODE_DAEMON_TRIES}, relaunching in {wait:g} s"
        self._said[alloc.key] = said
        return Verdict(said, False)

    def steady(self, key: int, now: float) -> str | None:
        """A daemon that failed before and has now run ``NODE_DAEMON_STABLE_S`` since its
        launch: its failures are forgotten; returns the reason its jobs were given (to be
        cleared where it still stands), else None."""
        if not self.failing(key) or now - self._since.get(key, now) < NODE_DAEMON_STABLE_S:
            return None
        said = self._said.get(key)
        self.forget(key)
        return said

    def forget(self, key: int) -> None:
        self.backoff.forget(key)
        for kept in (self._mark, self._since, self._said):
            kept.pop(key, None)
