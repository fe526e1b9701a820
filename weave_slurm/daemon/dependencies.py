"""What a pending job waits for besides room: its user's hold, and its ``--dependency``.

A job submitted with ``--hold`` (or held with ``weave hold``) stays PENDING until
``weave release``, as Slurm's ``JobHeldUser``. A job with a ``--dependency``
(:mod:`weave_slurm.config.dependency`) is placed once every part holds; until then its
REASON names the job it waits for (as squeue's ``Dependency``), and once a part can no
longer hold (``afterok`` on a job that failed) it says so and stays PENDING for its
user to cancel (as Slurm's ``DependencyNeverSatisfied`` without ``kill_invalid_depend``).
"""

from __future__ import annotations

from collections.abc import Callable

from weave_slurm.config.dependency import Dependency, parse_dependency
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState

_NOT_STARTED = (JobState.PENDING, JobState.PLACED)
_NOT_OK = (JobState.FAILED, JobState.CANCELLED, JobState.REFUSED)
_WAIT_WORDS = {"after": "to start", "afterany": "to end", "afterok": "to complete",
               "afternotok": "to fail or be cancelled"}


def wait_reason(job: JobRow, state_of: Callable[[int], JobState | None]) -> str | None:
    """Why ``job`` may not be placed yet (None: nothing it waits for but room)."""
    if job.held:
        return f"held by its user: weave release {job.job_id} (as squeue's JobHeldUser)"
    text = job.spec.slurm.dependency if job.spec is not None else None
    if not text:
        return None
    for part in parse_dependency(text):
        for dep in part.job_ids:
            why = _part(part, dep, state_of(dep))
            if why is not None:
                return why
    return None


def _part(part: Dependency, dep: int, state: JobState | None) -> str | None:
    """Why the part on job ``dep`` does not hold yet, or never will (None: it holds)."""
    if state is None:
        return _never(part, f"job {dep} does not exist")
    done = {"after": state not in _NOT_STARTED, "afterany": state.final,
            "afterok": state is JobState.COMPLETED,
            "afternotok": state in _NOT_OK}[part.kind]
    if done:
        return None
    never = state.final and part.kind in ("afterok", "afternotok")
    if never:
        return _never(part, f"job {dep} is {state.value}")
    return f"waiting for job {dep} {_WAIT_WORDS[part.kind]} ({part}; as squeue's Dependency)"


def _never(part: Dependency, what: str) -> str:
    return (f"its dependency can never be satisfied: {what} ({part}; as squeue's "
            "DependencyNeverSatisfied): cancel it")


def unknown_jobs(text: str, exists: Callable[[int], bool]) -> list[int]:
    """The job ids ``text`` names that do not exist (refused at submission)."""
    return sorted({j for part in parse_dependency(text) for j in part.job_ids
                   if not exists(j)})
