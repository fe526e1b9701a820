"""Fair share and limits inside weaved: the order pending jobs are placed in, the jobs
a limit holds, and the submissions a limit refuses (docs/fairshare.md).

- **Order** (:func:`queue`). With a ``[fairshare]`` table, pending jobs are placed in
  order of their fair-share priority (:mod:`weave_slurm.placement.priority`: recent
  GPU-hours of their user and account against their shares, plus their age), ties by
  submission; without one, by submission (job id), as before.
- **Held** (:func:`queue`). A job whose user (account) already has
  ``limits.user.max_running`` (``limits.account.max_running``) jobs placed or running
  stays PENDING, its REASON naming the limit, as squeue's
  ``QOSMaxJobsPerUserLimit``; it is placed once one of them ends.
- **Refused** (:func:`submission_refusal`). A submission past ``max_pending`` or
  ``submissions_per_minute`` of its user or account is refused in one line naming the
  limit (nothing stored), as sbatch's ``QOSMaxSubmitJobPerUserLimit``.

A job's account is its own (``#SBATCH -A``), else the site's ``[slurm] account``, else
``(none)``: every job without one shares that one account.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from weave_slurm.config.fairshare import FairShareConfig, JobLimits
from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon import accounting_limits
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.dependencies import wait_reason
from weave_slurm.daemon.job_arrays import limit_holds
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.charge import Charge
from weave_slurm.placement import Placement, Refusal
from weave_slurm.placement.priority import Claimant, FairShare, Usage
from weave_slurm.slurm.accounting import Accounting

#: The account of jobs that name none where the site names none either.
NO_ACCOUNT = "(none)"
#: What counts against ``max_running``: placed, running, or still ending.
HOLDING = (JobState.PLACED, JobState.RUNNING, JobState.CANCELLING)
#: Slurm's names for each limit, said in a REASON or refusal (squeue(1), sbatch).
_SLURM_NAME = {("user", "max_running"): "QOSMaxJobsPerUserLimit",
               ("account", "max_running"): "AssocMaxJobsLimit",
               ("user", "max_pending"): "QOSMaxSubmitJobPerUserLimit",
               ("account", "max_pending"): "AssocMaxSubmitJobLimit",
               ("user", "submissions_per_minute"): "a submission rate limit",
               ("account", "submissions_per_minute"): "a submission rate limit"}


def charged(charge: Charge, site: SiteConfig) -> tuple[str, str | None]:
    """(account, QOS) of a job that asks for ``charge``: its own, else the site's; the
    account else ``(none)`` (module doc), the QOS else None (its association's
    default)."""
    return (charge.account or site.slurm.account or NO_ACCOUNT,
            charge.qos or site.slurm.qos)


def account_of(job: JobRow, site: SiteConfig) -> str:
    """The Slurm account a job is charged to (module doc)."""
    return charged(job.profile.charge, site)[0]


def _limits(site: SiteConfig) -> tuple[tuple[str, JobLimits], ...]:
    return (("user", site.limits.user), ("account", site.limits.account))


def _words(kind: str, name: str, key: str, have: int, limit: int, what: str) -> str:
    """``what`` names one job ('pending job'); said of ``have`` of them."""
    what = what if have == 1 else what.replace("job", "jobs", 1)
    return (f"{kind} {name} has {have} {what}, the site's limit (limits.{kind}.{key} = "
            f"{limit}; as Slurm's {_SLURM_NAME[(kind, key)]})")


def qos_of(job: JobRow, site: SiteConfig) -> str | None:
    """The QOS a job asked for (None: its association's default)."""
    return charged(job.profile.charge, site)[1]


def submission_refusal(store: Store, site: SiteConfig, user: str, account: str,
                       now: float, feed: AccountingFeed | None = None,
                       qos: str | None = None) -> str | None:
    """Why a new job of ``user`` in ``account`` (asking for ``qos``) is refused now
    (None: it is taken); ``feed``: Slurm's accounting, with ``[limits] from_slurm``."""
    acct = feed.current if feed is not None else None
    if acct is not None:
        live = store.jobs([JobState.PENDING, *HOLDING])
        counts = accounting_limits.count(acct, ((j.user, account_of(j, site), qos_of(j, site))
                                                for j in live))
        refused = accounting_limits.submit_refusal(acct, user, account, qos, counts)
        if refused is not None:
            return refused
    if not any(limits.any for _, limits in _limits(site)):
        return None
    pending = store.jobs([JobState.PENDING])
    recent = store.jobs_submitted_since(now - 60.0)
    for kind, limits in _limits(site):
        name = user if kind == "user" else account

        def mine(job: JobRow, kind: str = kind, name: str = name) -> bool:
            return (job.user if kind == "user" else account_of(job, site)) == name
        have = sum(map(mine, pending))
        if limits.max_pending is not None and have >= limits.max_pending:
            return _words(kind, name, "max_pending", have, limits.max_pending, "pending job")
        sent = sum(map(mine, recent))
        rate = limits.submissions_per_minute
        if rate is not None and sent >= rate:
            return _words(kind, name, "submissions_per_minute", sent, rate,
                          "job submitted in the last minute") + "; submit again later"
    return None


@dataclass
class Queue:
    """Pending jobs in the order to place them, and those that wait (job -> REASON): held
    by their user, for a dependency, or by a limit."""

    ordered: list[JobRow]
    held: dict[int, str] = field(default_factory=dict)
    priority: dict[int, int] = field(default_factory=dict)   # with [fairshare]


def queue(store: Store, site: SiteConfig, pending: Sequence[JobRow], now: float,
          feed: AccountingFeed | None = None) -> Queue:
    """Order ``pending`` and hold what its user's hold, its dependency
    (:mod:`~weave_slurm.daemon.dependencies`), its array's ``%n``
    (:mod:`~weave_slurm.daemon.job_arrays`), a ``max_running`` limit or one of Slurm's
    accounting (``feed``, :mod:`~weave_slurm.daemon.accounting_limits`) holds (module
    doc)."""
    states: dict[int, JobState | None] = {}

    def state_of(job_id: int) -> JobState | None:
        if job_id not in states:
            row = store.job(job_id)
            states[job_id] = None if row is None else row.state
        return states[job_id]

    waits = {j.job_id: why for j in pending if (why := wait_reason(j, state_of)) is not None}
    pending = [j for j in pending if j.job_id not in waits]
    ordered = sorted(pending, key=lambda j: j.job_id)
    priority: dict[int, int] = {}
    if site.fairshare.enabled:
        share = FairShare(_fairshare(site, feed), _usage(store, site, now),
                          [_claimant(j, site) for j in pending], now)
        priority = {j.job_id: share.priority(_claimant(j, site)) for j in pending}
        ordered.sort(key=lambda j: (-priority[j.job_id], j.submitted_s, j.job_id))
    arrays = limit_holds(store.jobs(HOLDING), ordered)    # an array's %n
    ordered = [j for j in ordered if j.job_id not in arrays]
    out = Queue([], held={**waits, **arrays}, priority=priority)
    if feed is not None and feed.current is None:   # no limits known yet: all wait
        why = feed.waiting() or ""
        out.held.update({j.job_id: why for j in ordered})
        return out
    acct = feed.current if feed is not None else None
    site_caps = [(kind, limits.max_running) for kind, limits in _limits(site)
                 if limits.max_running is not None]
    if not site_caps and acct is None:
        out.ordered = ordered
        return out
    running: dict[tuple[str, ...], int] = {}
    for job in store.jobs(HOLDING):
        for key in _keys(job, site, acct):
            running[key] = running.get(key, 0) + 1
    for job in ordered:
        why = _held_by(job, site, site_caps, acct, running)
        if why is not None:
            out.held[job.job_id] = "held: " + why
            continue
        out.ordered.append(job)      # counted as if placed: later ones wait their turn
        for key in _keys(job, site, acct):
            running[key] = running.get(key, 0) + 1
    return out


def _fairshare(site: SiteConfig, feed: AccountingFeed | None) -> FairShareConfig:
    """``[fairshare]``, with the shares of Slurm's associations where weaved reads them
    (they replace the site file's)."""
    if feed is None or feed.current is None:
        return site.fairshare
    users, accounts = feed.current.shares()
    return dataclasses.replace(site.fairshare, users=users, accounts=accounts)


def _keys(job: JobRow, site: SiteConfig, acct: Accounting | None) -> list[tuple[str, ...]]:
    """The counters a job placed or running counts under (the site's, Slurm's)."""
    account = account_of(job, site)
    out: list[tuple[str, ...]] = [("user", job.user), ("account", account)]
    if acct is not None:
        out += accounting_limits.keys(acct, job.user, account, qos_of(job, site))
    return out


def _held_by(job: JobRow, site: SiteConfig, site_caps: Sequence[tuple[str, int]],
             acct: Accounting | None, running: dict[tuple[str, ...], int]) -> str | None:
    """The first limit that holds ``job`` now, in words (None: it may be placed)."""
    names = {"user": job.user, "account": account_of(job, site)}
    for kind, cap in site_caps:
        have = running.get((kind, names[kind]), 0)
        if have >= cap:
            return _words(kind, names[kind], "max_running", have, cap,
                          "job placed or running")
    if acct is None:
        return None
    missing = accounting_limits.no_association(acct, job.user, names["account"])
    if missing is not None:
        return missing
    for cap_ in accounting_limits.running_caps(acct, job.user, names["account"],
                                               qos_of(job, site)):
        have = running.get(cap_.key, 0)
        if have >= cap_.limit:
            return cap_.words(have)
    return None


def overtaken(decisions: Sequence[Placement | Refusal]) -> bool:
    """Whether a placement in queue order left a job waiting for room while it placed a
    later one (the cheapest order of the portfolio may; fair share then places in
    queue order)."""
    waiting = False
    for decision in decisions:
        if isinstance(decision, Refusal) and decision.retry:
            waiting = True
        elif isinstance(decision, Placement) and waiting:
            return True
    return False


def _claimant(job: JobRow, site: SiteConfig) -> Claimant:
    return Claimant(job.user, account_of(job, site), job.submitted_s)


#: Usage booked longer ago than this many half-lives counts for less than 0.1%: left out.
_FORGOTTEN_HALF_LIVES = 10


def _usage(store: Store, site: SiteConfig, now: float) -> list[Usage]:
    """The booked GPU-seconds of every job that still counts, with its user and account
    (read each tick with pending jobs: old jobs' rows are not parsed)."""
    since = now - _FORGOTTEN_HALF_LIVES * site.fairshare.half_life_h * 3600.0
    recent = {job_id: u for job_id, u in store.usage().items() if u.updated_s >= since}
    return [Usage(job.user, account_of(job, site), sum(recent[job.job_id].gpu_s.values()),
                  recent[job.job_id].updated_s)
            for job in store.jobs(ids=list(recent))]
