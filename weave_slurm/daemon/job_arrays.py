"""Job arrays in weaved: the elements a submission stores, the ``%n`` limit, the
``ID_TASK`` names squeue shows, and what ``weave cancel ID`` of an array reaches.

Each element is a weave job of its own (``config/job_array.py``). The first element's
job id is the array's job id; ``weave cancel`` of that id cancels every element, as
``scancel`` does. An element's spec is the array's with ``[slurm] array_job`` and
``array_task`` set and its ``seed`` plus its task id. An array's ``%n`` holds its
pending elements while ``n`` of them are placed or running; each says so in its REASON
(squeue's ``JobArrayTaskLimit``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from weave_slurm.config.job import JobSpec
from weave_slurm.config.job_array import parse_array
from weave_slurm.daemon.records import JobRow


def elements(spec: JobSpec) -> Callable[[int], list[JobSpec]]:
    """Given the array's job id (its first element's), each element's spec (module doc)."""
    tasks = parse_array(spec.slurm.array or "").tasks

    def specs(array_job: int) -> list[JobSpec]:
        return [dataclasses.replace(spec, seed=spec.seed + task, slurm=dataclasses.replace(
            spec.slurm, array_job=array_job, array_task=task)) for task in tasks]
    return specs


def array_of(job: JobRow) -> tuple[int, int] | None:
    """``(array job id, task id)`` of an element (None: not in an array)."""
    slurm = job.spec.slurm if job.spec is not None else None
    if slurm is None or slurm.array_job is None or slurm.array_task is None:
        return None
    return slurm.array_job, slurm.array_task


def shown_id(job: JobRow) -> str:
    """The id squeue would show: ``ARRAYID_TASK`` for an element, else the job id."""
    of = array_of(job)
    return str(job.job_id) if of is None else f"{of[0]}_{of[1]}"


def members(array_job: int, jobs: Iterable[JobRow]) -> list[int]:
    """The job ids of array ``array_job``'s elements among ``jobs`` (none: not an array)."""
    return [j.job_id for j in jobs if (of := array_of(j)) is not None and of[0] == array_job]


def limit_holds(placed: Sequence[JobRow], ordered: Sequence[JobRow]) -> dict[int, str]:
    """The pending elements of ``ordered`` an array's ``%n`` holds back (job -> REASON),
    with ``placed`` the jobs placed or running; those let through count as placed."""
    running: dict[int, int] = {}
    for job in placed:
        if (of := array_of(job)) is not None:
            running[of[0]] = running.get(of[0], 0) + 1
    held: dict[int, str] = {}
    for job in ordered:
        of = array_of(job)
        text = job.spec.slurm.array if job.spec is not None else None
        limit = parse_array(text).limit if of is not None and text else None
        if of is None or limit is None:
            continue
        if running.get(of[0], 0) >= limit:
            held[job.job_id] = (f"held: {running[of[0]]} of array {of[0]}'s elements run, its "
                                f"limit is {limit} (--array ...%{limit}; as squeue's "
                                "JobArrayTaskLimit)")
            continue
        running[of[0]] = running.get(of[0], 0) + 1
    return held
