"""Slurm's association and QOS limits inside weaved (``[limits] from_slurm = true``).

weaved reads the cluster's accounting (:mod:`weave_slurm.slurm.accounting`) and holds
each of its jobs to what Slurm would hold a job of the same user, account and QOS to,
beside the site file's own tables (``daemon/limits.py``; the stricter wins):

- **At submission** (:func:`submit_refusal`): a user with no association with the
  job's account is refused (as sbatch: "Invalid account or account/partition
  combination specified"); so is a job past its association's ``MaxSubmitJobs``, its
  account's ``GrpSubmitJobs``, or its QOS's ``MaxSubmitJobsPerUser`` /
  ``MaxSubmitJobsPerAccount``, counting its user's (account's) jobs pending, placed or
  running, as Slurm does.
- **While pending** (:func:`running_caps`): ``MaxJobs``, ``GrpJobs``, ``MaxJobsPerUser``
  and ``MaxJobsPerAccount`` hold a job PENDING with squeue's words for each
  (``AssocMaxJobsLimit``, ``AssocGrpJobsLimit``, ``QOSMaxJobsPerUserLimit``,
  ``QOSMaxJobsPerAccountLimit``).

A job's QOS is the one it asked for (``#SBATCH --qos``, ``[slurm] qos``), else its
association's default, else ``normal``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from weave_slurm.errors import WeaveError
from weave_slurm.slurm.accounting import Accounting

log = logging.getLogger(__name__)

#: A counter of jobs: ("assoc", account, user), ("grp", account), ("qos-u", qos,
#: user), ("qos-a", qos, account).
Key = tuple[str, ...]


@dataclass(frozen=True)
class Cap:
    """One limit on a job: the jobs counted under ``key`` must stay below ``limit``;
    ``words(have)`` says so (a REASON, or a refusal)."""

    key: Key
    limit: int
    words: Callable[[int], str]


def keys(acct: Accounting, user: str, account: str, qos: str | None) -> list[Key]:
    """Every counter a job of ``user`` in ``account`` asking for ``qos`` counts under."""
    q = acct.qos_of(user, account, qos)
    out: list[Key] = [("assoc", account, user), ("grp", account)]
    if q is not None:
        out += [("qos-u", q.name, user), ("qos-a", q.name, account)]
    return out


def count(acct: Accounting, jobs: Iterable[tuple[str, str, str | None]]) -> dict[Key, int]:
    """How many of ``jobs`` (user, account, qos) count under each counter."""
    counts: dict[Key, int] = {}
    for user, account, qos in jobs:
        for key in keys(acct, user, account, qos):
            counts[key] = counts.get(key, 0) + 1
    return counts


def no_association(acct: Accounting, user: str, account: str) -> str | None:
    """Why ``user`` may not run in ``account`` at all (None: it has an association)."""
    if acct.association(user, account) is not None:
        return None
    return (f"user {user} has no association with account {account} in cluster "
            f"{acct.cluster}'s Slurm accounting (as Slurm's 'Invalid account or "
            f"account/partition combination specified'; an admin adds it: sacctmgr add "
            f"user {user} account={account})")


def submit_refusal(acct: Accounting, user: str, account: str, qos: str | None,
                   counts: Mapping[Key, int]) -> str | None:
    """Why a new job is refused (None: taken); ``counts``: the jobs pending, placed or
    running now (:func:`count`)."""
    missing = no_association(acct, user, account)
    if missing is not None:
        return missing
    for cap in _caps(acct, user, account, qos, submit=True):
        have = counts.get(cap.key, 0)
        if have >= cap.limit:
            return cap.words(have)
    return None


def running_caps(acct: Accounting, user: str, account: str, qos: str | None) -> list[Cap]:
    """The limits on how many jobs like this one may be placed or running at once."""
    return _caps(acct, user, account, qos, submit=False)


def _caps(acct: Accounting, user: str, account: str, qos: str | None,
          submit: bool) -> list[Cap]:
    assoc, mine = acct.association(user, account), acct.account_association(account)
    q = acct.qos_of(user, account, qos)
    what = "pending or running" if submit else "placed or running"

    def cap(key: Key, limit: int | None, who: str, name: str, slurm: str) -> list[Cap]:
        if limit is None:
            return []
        return [Cap(key, limit, lambda have: (
            f"{who} has {have} job{'' if have == 1 else 's'} {what}, {name} = {limit} "
            f"(Slurm accounting; as Slurm's {slurm})"))]
    out: list[Cap] = []
    if assoc is not None:
        out += cap(("assoc", account, user), assoc.max_submit if submit else assoc.max_jobs,
                   f"user {user} in account {account}",
                   f"its association's {'MaxSubmitJobs' if submit else 'MaxJobs'}",
                   "AssocMaxSubmitJobLimit" if submit else "AssocMaxJobsLimit")
    if mine is not None:
        out += cap(("grp", account), mine.grp_submit if submit else mine.grp_jobs,
                   f"account {account}", f"its {'GrpSubmitJobs' if submit else 'GrpJobs'}",
                   "AssocGrpSubmitJobsLimit" if submit else "AssocGrpJobsLimit")
    if q is not None:
        kind = "Submit" if submit else ""
        out += cap(("qos-u", q.name, user), q.max_submit_pu if submit else q.max_jobs_pu,
                   f"user {user} under QOS {q.name}",
                   f"its Max{'SubmitJobs' if submit else 'Jobs'}PerUser",
                   f"QOSMax{kind}Job{'' if submit else 's'}PerUserLimit")
        out += cap(("qos-a", q.name, account), q.max_submit_pa if submit else q.max_jobs_pa,
                   f"account {account} under QOS {q.name}",
                   f"its Max{'SubmitJobs' if submit else 'Jobs'}PerAccount",
                   f"QOSMax{kind}Job{'' if submit else 's'}PerAccountLimit")
    return out


class AccountingFeed:
    """The cluster's accounting as weaved last read it: read at the first
    :meth:`refresh` and again once ``refresh_s`` passed. A failed read keeps the last
    good one (Slurm keeps its cached associations while slurmdbd is away); before any,
    ``current`` is None and ``error`` says why."""

    def __init__(self, read: Callable[[], Accounting], refresh_s: float) -> None:
        self._read, self.refresh_s = read, refresh_s
        self.current: Accounting | None = None
        self.error: str | None = None
        self._at: float | None = None

    def refresh(self, now: float) -> None:
        if self._at is not None and now - self._at < self.refresh_s:
            return
        self._at = now
        try:
            self.current, self.error = self._read(), None
        except WeaveError as exc:
            self.error = str(exc)
            log.warning("reading Slurm's accounting for the users' limits: %s%s", exc,
                        "" if self.current is None else " (the last read's limits hold)")

    def waiting(self) -> str | None:
        """Why pending jobs wait (None: a read succeeded once)."""
        if self.current is not None:
            return None
        return (f"waiting for Slurm's accounting (limits.from_slurm): "
                f"{self.error or 'not read yet'}")
