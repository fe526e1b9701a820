"""Which jobs may share a co-execution group at all, before any schedule (pure).

Charge (``model/charge.py``): a group's allocations carry one Slurm account and one
QOS, and every member is charged through them, so a job joins only a group whose
members have its charge, and a group is formed only from jobs of one charge. Jobs
without an account or QOS of their own (and a site without ``[slurm]``) all have
the same charge, so for them nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.group import Group


def may_share(group: Group, job: JobProfile) -> bool:
    """``job`` may join ``group``: same charge (every member has the group's). Asked for
    every group on every arrival, so the common case (one shared object) is an ``is``."""
    if not group.members:
        return True
    charge = group.members[0].job.charge
    return charge is job.charge or charge == job.charge


def one_charge(jobs: Iterable[JobProfile]) -> bool:
    """These jobs may form one group."""
    return len({j.charge for j in jobs}) <= 1
