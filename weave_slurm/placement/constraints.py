"""Which jobs may share a co-execution group at all, before any schedule (pure).

Charge (``model/charge.py``): a group's allocations carry one Slurm account and one
QOS, and every member is charged through them, so a job joins only a group whose
members have its charge, and a group is formed only from jobs of one charge. Jobs
without an account or QOS of their own (and a site without ``[slurm]``) all have
the same charge, so for them nothing changes.

Solo (``JobProfile.solo``, ``weave-sbatch --solo``): a solo job is a group of its own;
it joins no group and no job joins its group.
"""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.group import Group


def may_share(group: Group, job: JobProfile) -> bool:
    """``job`` may join ``group``: neither runs solo, and the same charge (every member
    has the group's). Asked for every group on every arrival, so the common case (one
    shared object) is an ``is``; a solo job's group has it as its only member."""
    if not group.members:
        return True
    first = group.members[0].job
    if job.solo or first.solo:
        return False
    return first.charge is job.charge or first.charge == job.charge


def may_group(jobs: Sequence[JobProfile]) -> bool:
    """These jobs may form one group: one charge, and a solo job only alone."""
    return len(jobs) <= 1 or (len({j.charge for j in jobs}) == 1
                              and not any(j.solo for j in jobs))
