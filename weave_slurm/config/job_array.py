"""sbatch's ``--array``: one weave job per element of an index set.

``--array=a-b[:s][%n]`` or a list ``1,3,5-7[:s]...[%n]``, as sbatch takes it: indices
from 0 to :data:`MAX_TASK_ID` (Slurm's default ``MaxArraySize`` of 1001 allows 0-1000),
each at most once, ``%n`` at most ``n`` elements running at once. weaved stores one job
per element (``daemon/api.py``): the first element's job id is the array's job id
(``SLURM_ARRAY_JOB_ID``, as Slurm), each element's spec names the array and its own
task id (``JobSlurm.array_job``/``array_task``), and its ``seed`` is the spec's seed plus
its task id (docs/job_api.md, "Job arrays"). ``%n`` is a limit weaved keeps when it
places jobs: an element held back by it says so in its REASON (squeue's
``JobArrayTaskLimit``; ``daemon/job_arrays.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.errors import ConfigError

#: The largest task index (Slurm's default MaxArraySize 1001: indices 0-1000).
MAX_TASK_ID = 1000
FORMS = "a-b[:s][%n] or a list such as 1,3,5-7, indices 0-1000 (e.g. 0-9%2)"


@dataclass(frozen=True, slots=True)
class JobArray:
    """An ``--array`` value: its task ids (ascending) and its running limit."""

    tasks: tuple[int, ...]
    limit: int | None = None     # %n: at most this many running at once

    @property
    def step(self) -> int:
        """The stride between task ids when they are evenly spaced, else 1 (one task: 1)."""
        gaps = {b - a for a, b in zip(self.tasks, self.tasks[1:], strict=False)}
        return gaps.pop() if len(gaps) == 1 else 1

    def env(self, array_job: int, task: int) -> dict[str, str]:
        """The ``SLURM_ARRAY_*`` variables of element ``task`` (as sbatch sets them)."""
        return {"SLURM_ARRAY_JOB_ID": str(array_job), "SLURM_ARRAY_TASK_ID": str(task),
                "SLURM_ARRAY_TASK_COUNT": str(len(self.tasks)),
                "SLURM_ARRAY_TASK_MIN": str(self.tasks[0]),
                "SLURM_ARRAY_TASK_MAX": str(self.tasks[-1]),
                "SLURM_ARRAY_TASK_STEP": str(self.step)}


def parse_array(text: str) -> JobArray:
    """``text`` as an array (ConfigError naming the bad part and the valid forms)."""
    body, pct, limit_text = text.strip().partition("%")
    limit = None
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ConfigError(f"'{text}': the limit after '%' must be a whole number >= 1; "
                              f"valid: {FORMS}")
        limit = int(limit_text)
    tasks: set[int] = set()
    for part in body.split(","):
        tasks.update(_part(part.strip(), text))
    return JobArray(tuple(sorted(tasks)), limit)


def _part(part: str, text: str) -> range:
    span, colon, step_text = part.partition(":")
    lo_text, dash, hi_text = span.partition("-")
    numbers = [lo_text, *([hi_text] if dash else []), *([step_text] if colon else [])]
    if not all(n.isdigit() and len(n) <= 9 for n in numbers) or (colon and not dash):
        raise ConfigError(f"'{part}' of '{text}' is not a task range; valid: {FORMS}")
    lo = int(lo_text)
    hi = int(hi_text) if dash else lo
    step = int(step_text) if colon else 1
    if hi < lo or step < 1:
        raise ConfigError(f"'{part}' of '{text}': a range goes up (a-b with a <= b, step "
                          f">= 1); valid: {FORMS}")
    if hi > MAX_TASK_ID:
        raise ConfigError(f"'{part}' of '{text}': task index {hi} is over {MAX_TASK_ID} "
                          f"(Slurm's default MaxArraySize); valid: {FORMS}")
    return range(lo, hi + 1, step)


def array_text(text: str) -> str:
    """``text`` checked and written as weave keeps it (as given, without spaces)."""
    parse_array(text)
    return "".join(text.split())
