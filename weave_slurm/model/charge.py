"""What a job is charged to in Slurm: its account and QOS (a grouping constraint).

A co-execution group's allocations are asked for once, with one ``--account`` and one
``--qos``, and every member runs inside them; so a job's charge is part of what it
is, and placement only groups jobs of equal charge (``placement/constraints.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.config.job import JobSpec
from weave_slurm.config.site import SlurmConfig


@dataclass(frozen=True, slots=True)
class Charge:
    """A Slurm account and QOS (None: Slurm's default for the user running weaved)."""

    account: str | None = None
    qos: str | None = None

    def __str__(self) -> str:
        return f"account={self.account or '(default)'} qos={self.qos or '(default)'}"


#: Slurm's defaults (a job and site naming no account or QOS).
NO_CHARGE = Charge()


def job_charge(spec: JobSpec, site: SlurmConfig) -> Charge:
    """The job's own ``[slurm]`` account and QOS, else the site's ``[slurm]`` ones."""
    return Charge(account=spec.slurm.account or site.account, qos=spec.slurm.qos or site.qos)
