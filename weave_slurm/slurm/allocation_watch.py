"""A process of one of weaved's steps ends itself once its own Slurm allocation no
longer runs: the node daemon (``weave node serve``) and the sync agents.

A host cut off the network loses its allocation: Slurm marks the node DOWN and ends
the job, but nobody tells the host, and when it answers again Slurm takes it back
while the lost allocation's steps run on there (docs/reliability.md, B2, F17). So each
asks Slurm every ``interval_s`` about the job its step belongs to
(``SLURM_JOB_ID``): ``squeue -h -j ID -o %T``, through the one door to Slurm commands
(:mod:`weave_slurm.slurm.command_runner`).

Only a definite answer ends it: the job in a final state or ending (``COMPLETING``: the
allocation is being taken down), or slurmctld saying it does
not know the job (``Invalid job id specified``, or an empty listing). A command that
fails otherwise or hangs (the host still cut off, slurmctld restarting) is no answer:
the daemon keeps serving and asks again next time. Off without ``SLURM_JOB_ID`` and
with an interval of 0. On the local backend there is no Slurm to ask: its tasks read
the backend's state file (``$WEAVE_LOCAL_BACKEND_STATE``) instead, where their
allocation is listed until it is released; a file that is gone (its state dir removed)
ends them too (issue 33, defect 6).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.slurm.command_runner import CommandRunner, SlurmCommandError, SubprocessRunner

log = logging.getLogger(__name__)

#: ``weave node serve --allocation-watch-s`` reads it when the flag is not given.
ENV_INTERVAL = "WEAVE_NODE_ALLOCATION_WATCH_S"
DEFAULT_INTERVAL_S = 30.0
DEFAULT_TIMEOUT_S = 20.0

#: Job states after which the allocation runs no more (squeue's %T spelling).
FINAL_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED",
})
#: An allocation Slurm is ending (its processes are being killed): it never runs again,
#: so a step's SIGTERM in this state is the end of the allocation, not a stop whose
#: state is wanted again (``scancel`` of the allocation; issue 33, defect 6).
ENDING_STATES = frozenset({"COMPLETING"})
_UNKNOWN_JOB = "invalid job id specified"


class Verdict(enum.Enum):
    """What one question to Slurm said about the allocation."""

    RUNNING = "running"      # listed in a state that is not final (R, S, PD ...)
    GONE = "gone"            # a definite answer: final or ending (CG), or unknown
    NO_ANSWER = "no answer"  # the command failed or hung: nothing is known


@dataclass(frozen=True)
class Answer:
    verdict: Verdict
    detail: str              # the state, or why there was no answer, in words


def ask(runner: CommandRunner, job_id: str, timeout_s: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None) -> Answer:
    """One ``squeue -h -j ID -o %T``; what it says about job ``job_id``."""
    argv = ["squeue", "-h", "-j", job_id, "-o", "%T"]
    try:
        res = runner.run(argv, timeout_s=timeout_s, env=env)
    except SlurmCommandError as exc:
        text = f"{exc.stderr} {exc.stdout}".strip()
        if not exc.timed_out and exc.returncode is not None \
                and _UNKNOWN_JOB in text.lower():
            return Answer(Verdict.GONE, f"slurmctld does not know job {job_id} "
                                        f"({text.splitlines()[0] if text else 'squeue'})")
        return Answer(Verdict.NO_ANSWER, str(exc).splitlines()[0] if str(exc) else text)
    states = [s.strip().upper() for s in res.stdout.splitlines() if s.strip()]
    if not states:
        return Answer(Verdict.GONE, f"squeue lists no job {job_id}")
    live = [s for s in states if s not in FINAL_STATES | ENDING_STATES]
    if live:
        return Answer(Verdict.RUNNING, live[0])
    return Answer(Verdict.GONE, f"job {job_id} is {states[0]}")


#: The local backend's state file, in each of its tasks' environment (slurm/local_backend.py).
LOCAL_STATE_ENV = "WEAVE_LOCAL_BACKEND_STATE"


def ask_local(state_file: Path, job_id: str) -> Answer:
    """What the local backend's ``state_file`` says about allocation ``job_id``: gone
    once it is not listed there or the file is gone (written whole: never half read)."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return Answer(Verdict.GONE, f"the local backend's state {state_file} is gone")
    except (OSError, ValueError) as exc:
        return Answer(Verdict.NO_ANSWER, f"{state_file}: {exc}")
    if job_id not in (state.get("allocations") or {}):
        return Answer(Verdict.GONE, f"the local backend holds no allocation {job_id}")
    return Answer(Verdict.RUNNING, "held by the local backend")


def interval_from(value: float | None, env: Mapping[str, str]) -> float:
    """The watch interval: ``value`` if given, else ``$WEAVE_NODE_ALLOCATION_WATCH_S``,
    else 30 s; an unreadable or negative value is 0 (off) with a warning."""
    if value is not None:
        return max(0.0, value)
    raw = env.get(ENV_INTERVAL)
    if raw is None or not raw.strip():
        return DEFAULT_INTERVAL_S
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning("%s=%r is not a number of seconds: allocation watch off",
                    ENV_INTERVAL, raw)
        return 0.0


class AllocationWatch:
    """Asks Slurm every ``interval_s`` whether job ``job_id`` still runs; calls
    ``on_gone(reason)`` once, at the first definite answer that it does not."""

    def __init__(self, job_id: str, interval_s: float, on_gone: Callable[[str], None],
                 runner: CommandRunner | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, who: str = "node daemon",
                 local_state: Path | None = None) -> None:
        self.job_id, self.interval_s, self.on_gone = job_id, interval_s, on_gone
        self.who = who   # what ends when the allocation is gone, for the log line
        self.local_state = local_state   # the local backend's file, asked instead of Slurm
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.timeout_s = min(timeout_s, max(interval_s, 1.0))
        self.gone: str | None = None
        self._silent_since: int | None = None   # checks without an answer in a row
        self._checks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Answer:
        """Ask once; log the first of a run of no-answers and the way back from it."""
        self._checks += 1
        answer = self._ask(self.timeout_s)
        if answer.verdict is Verdict.NO_ANSWER:
            if self._silent_since is None:
                self._silent_since = self._checks
                log.warning("allocation watch: no answer from Slurm about job %s (%s); "
                            "serving on, asking again in %g s", self.job_id,
                            answer.detail, self.interval_s)
            return answer
        if self._silent_since is not None:
            log.info("allocation watch: Slurm answers again about job %s after %d "
                     "unanswered checks", self.job_id, self._checks - self._silent_since)
            self._silent_since = None
        if answer.verdict is Verdict.GONE and self.gone is None:
            self.gone = answer.detail
            log.warning("%s exits: its allocation no longer runs (%s)", self.who,
                        answer.detail)
            self.on_gone(answer.detail)
        return answer

    def ended_now(self, timeout_s: float = 5.0) -> str | None:
        """Ask once, now (a signal came: is it the end of the allocation?): why it no
        longer runs if Slurm definitely says so, else None. ``on_gone`` is not called."""
        answer = self._ask(min(timeout_s, self.timeout_s))
        return answer.detail if answer.verdict is Verdict.GONE else None

    def _ask(self, timeout_s: float) -> Answer:
        if self.local_state is not None:
            return ask_local(self.local_state, self.job_id)
        return ask(self.runner, self.job_id, timeout_s)

    def run(self) -> None:
        while not self._stop.wait(self.interval_s) and self.gone is None:
            try:
                self.check()
            except Exception:   # a bug here must not take the daemon down
                log.exception("allocation watch: check of job %s failed", self.job_id)

    def start(self) -> AllocationWatch:
        self._thread = threading.Thread(target=self.run, name="allocation-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


def start_watch(env: Mapping[str, str], interval_s: float,
                on_gone: Callable[[str], None],
                runner: CommandRunner | None = None) -> AllocationWatch | None:
    """A started watch of ``$SLURM_JOB_ID`` (on the local backend: of its allocation in
    ``$WEAVE_LOCAL_BACKEND_STATE``); None when off (no job id, interval 0)."""
    job_id = (env.get("SLURM_JOB_ID") or "").strip()
    if not job_id or interval_s <= 0:
        return None
    local = env.get(LOCAL_STATE_ENV) or None
    log.info("allocation watch: asking %s every %g s whether job %s still runs",
             local or "Slurm", interval_s, job_id)
    return AllocationWatch(job_id, interval_s, on_gone, runner,
                           local_state=Path(local) if local else None).start()
