"""Fair share between users and accounts, and what one of them may have at a time.

A shared site's ``[fairshare]`` table orders pending jobs as Slurm's multifactor
priority plugin does (``PriorityType=priority/multifactor``): a fair-share factor from
each user's and each account's recent GPU-hours against their shares, plus the job's
age; ``[limits.user]`` and ``[limits.account]`` bound what one user or one account may
have pending, running and submit per minute, as Slurm's association and QOS limits
(``MaxSubmitJobs``, ``MaxJobs``). None of it is set by default: a site without these
tables places pending jobs by submission order and limits nobody (docs/fairshare.md).

Slurm's defaults are kept where it has one: ``PriorityDecayHalfLife=7-0`` (168 h) and
``PriorityMaxAge=7-0`` (slurm.conf(5), Slurm 22.05).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weave_slurm.config.reader import TableReader

#: slurm.conf's PriorityDecayHalfLife and PriorityMaxAge defaults (7 days), in hours.
SLURM_HALF_LIFE_H = 7 * 24.0
SLURM_MAX_AGE_H = 7 * 24.0


@dataclass(frozen=True, slots=True)
class JobLimits:
    """What one user (or one account, all its users together) may have (None: no limit)."""

    max_pending: int | None = None             # jobs PENDING at once (MaxSubmitJobs-like)
    max_running: int | None = None             # jobs placed or running at once (MaxJobs)
    submissions_per_minute: int | None = None  # accepted submissions in any 60 s

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_pending, self.max_running,
                                           self.submissions_per_minute))


NO_LIMITS = JobLimits()


@dataclass(frozen=True, slots=True)
class FairShareConfig:
    """``[fairshare]``: how pending jobs are ordered (``enabled`` once the table is there)."""

    enabled: bool = False
    half_life_h: float = SLURM_HALF_LIFE_H   # recent usage counts half after this long
    max_age_h: float = SLURM_MAX_AGE_H       # a job's age factor is 1 after this long
    weight_fairshare: float = 10000.0        # PriorityWeightFairshare
    weight_age: float = 1000.0               # PriorityWeightAge
    default_share: float = 1.0               # a user or account not named
    users: Mapping[str, float] = field(default_factory=dict)      # GPU-hour shares
    accounts: Mapping[str, float] = field(default_factory=dict)

    def share(self, kind: str, name: str) -> float:
        table = self.users if kind == "user" else self.accounts
        return table.get(name, self.default_share)


def read_fairshare(r: TableReader | None) -> FairShareConfig:
    """``[fairshare]`` with its ``[fairshare.users]`` and ``[fairshare.accounts]`` shares."""
    if r is None:
        return FairShareConfig()
    d = FairShareConfig()
    shares = {kind: _shares(r.table(kind, required=False)) for kind in ("users", "accounts")}
    cfg = FairShareConfig(
        enabled=True,
        half_life_h=r.number("half_life_h", d.half_life_h, gt=0),
        max_age_h=r.number("max_age_h", d.max_age_h, gt=0),
        weight_fairshare=r.number("weight_fairshare", d.weight_fairshare, ge=0),
        weight_age=r.number("weight_age", d.weight_age, ge=0),
        default_share=r.number("default_share", d.default_share, gt=0),
        users=shares["users"], accounts=shares["accounts"])
    r.done()
    return cfg


def _shares(r: TableReader | None) -> dict[str, float]:
    if r is None:
        return {}
    out = {name: r.number(name, gt=0) for name in r.names()}
    r.done()
    return out


def read_limits(r: TableReader | None) -> JobLimits:
    """``[limits.user]`` or ``[limits.account]``: each key optional, each an integer >= 1."""
    if r is None:
        return NO_LIMITS
    limits = JobLimits(max_pending=r.opt_integer("max_pending", ge=1),
                       max_running=r.opt_integer("max_running", ge=1),
                       submissions_per_minute=r.opt_integer("submissions_per_minute", ge=1))
    r.done()
    return limits
