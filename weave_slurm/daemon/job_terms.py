"""A job's own Slurm terms inside weaved (``[slurm]`` of its spec, from ``#SBATCH -A/-q/-t``):
what its group's allocations are asked with, and when the job has run out of time.

- **Charge.** Placement groups only jobs of one charge (``placement/constraints.py``),
  so a group's allocations are asked with its members' account and QOS; a job naming
  none has the site's ``[slurm]`` ones (``model/charge.py``).
- **Time limit.** A job ends once it has run (RUNNING) as long as its ``--time``: FAILED
  with the reason ``reached its time limit ...`` (the store has no TIMEOUT state; this
  is Slurm's TIMEOUT). A group's allocation is asked with the site's time limit when it
  has one (a job's limit over it is refused at submission), else with the longest
  remaining limit of its members when each has one, else with none (the partition's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from weave_slurm.config.sbatch import JobSlurm
from weave_slurm.config.site import SlurmConfig
from weave_slurm.daemon.records import JobRow


@dataclass(frozen=True, slots=True)
class AllocTerms:
    """What one allocation of a group is asked with (None: Slurm's default)."""

    account: str | None
    qos: str | None
    time_limit_min: int | None


class JobTerms:
    """Each job's ``[slurm]`` table, as its spec was parsed at submission."""

    def of(self, job: JobRow) -> JobSlurm:
        """A spec an older weaved stored, which this one cannot read: no terms of its own."""
        return job.spec.slurm if job.spec is not None else JobSlurm()

    def remaining_min(self, job: JobRow, now: float) -> float | None:
        """Minutes the job may still run (None: no limit of its own)."""
        limit = self.of(job).time_limit_min
        if limit is None:
            return None
        ran_s = 0.0 if job.started_s is None else max(0.0, now - job.started_s)
        return limit - ran_s / 60.0

    def overdue(self, jobs: Sequence[JobRow], now: float) -> list[tuple[JobRow, str]]:
        """The RUNNING jobs among ``jobs`` that have used their time, with the reason."""
        out = []
        for job in jobs:
            left = self.remaining_min(job, now)
            if job.started_s is not None and left is not None and left <= 0:
                limit = self.of(job).time_limit_min
                out.append((job, f"reached its time limit ({limit} min, #SBATCH --time; "
                                 f"ran {(now - job.started_s) / 60:.1f} min): ended as "
                                 "Slurm's TIMEOUT"))
        return out

    def alloc_terms(self, site: SlurmConfig, members: Sequence[JobRow],
                    now: float) -> AllocTerms:
        """What a new allocation of a group with ``members`` is asked with."""
        charge = members[0].profile.charge if members else None   # one per group
        account = (charge.account if charge else None) or site.account
        qos = (charge.qos if charge else None) or site.qos
        limit = site.time_limit_min
        if limit is None and members:
            left = [self.remaining_min(j, now) for j in members]
            if all(x is not None for x in left):
                limit = max(1, math.ceil(max(x for x in left if x is not None)))
        return AllocTerms(account=account, qos=qos, time_limit_min=limit)
