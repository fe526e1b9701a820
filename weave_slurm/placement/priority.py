"""The fair-share priority of pending jobs, as Slurm's multifactor plugin computes it.

``priority = weight_fairshare * F + weight_age * A`` (slurm.conf's
``PriorityWeightFairshare`` and ``PriorityWeightAge``; the other factors of Slurm's
sum, job size, partition, QOS and TRES, are not used), where

- ``A = min(1, waited / max_age)``: how long the job has been pending, against
  ``PriorityMaxAge``;
- ``F = F(account) * F(user)``, each Slurm's classic fair-share factor
  ``2 ** (-U / S)`` on its level: ``U`` is the account's (user's) part of all recent
  usage, ``S`` its part of all shares. Recent usage is GPU-seconds decayed by half every
  ``half_life`` (``PriorityDecayHalfLife``): a job's usage counts from the last time it
  was booked (``Usage.at_s``). Who shares: every user (account) the site names, with
  recent usage, or with a pending job; one not named has ``default_share``.

A user who has used nothing lately has ``F = 1``; one who used exactly their share has
``F = 0.5``; twice their share, ``0.25``. Pure: every input is passed in, so the daemon
and the simulator order jobs the same way (docs/fairshare.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from weave_slurm.config.fairshare import FairShareConfig


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-seconds one job of ``user`` in ``account`` has used, booked last at ``at_s``."""

    user: str
    account: str
    gpu_s: float
    at_s: float


@dataclass(frozen=True, slots=True)
class Claimant:
    """Who a pending job belongs to, and since when it waits."""

    user: str
    account: str
    submitted_s: float


class FairShare:
    """Priorities of pending jobs against the recent usage of everyone (module doc)."""

    def __init__(self, cfg: FairShareConfig, usage: Iterable[Usage],
                 pending: Iterable[Claimant], now: float) -> None:
        self.cfg, self.now = cfg, now
        half_life_s = cfg.half_life_h * 3600.0
        used: dict[str, dict[str, float]] = {"user": {}, "account": {}}
        for u in usage:
            decayed = u.gpu_s * math.pow(0.5, max(0.0, now - u.at_s) / half_life_s)
            for kind, name in (("user", u.user), ("account", u.account)):
                used[kind][name] = used[kind].get(name, 0.0) + decayed
        waiting = list(pending)
        self._factor: dict[str, dict[str, float]] = {}
        for kind, named in (("user", cfg.users), ("account", cfg.accounts)):
            who = {*named, *used[kind], *(getattr(c, kind) for c in waiting)}
            self._factor[kind] = _factors(who, used[kind], functools.partial(cfg.share, kind))

    def factor(self, user: str, account: str) -> float:
        """``F`` of a job of ``user`` in ``account`` (1: nobody of them used anything)."""
        return self._factor["account"].get(account, 1.0) * self._factor["user"].get(user, 1.0)

    def priority(self, job: Claimant) -> int:
        """The job's priority (higher first), an integer as Slurm shows it."""
        age = min(1.0, max(0.0, self.now - job.submitted_s) / (self.cfg.max_age_h * 3600.0))
        return round(self.cfg.weight_fairshare * self.factor(job.user, job.account)
                     + self.cfg.weight_age * age)


def _factors(who: Iterable[str], used: Mapping[str, float],
             share: Callable[[str], float]) -> dict[str, float]:
    """``2 ** (-U / S)`` for each of ``who`` on one level."""
    names = sorted(set(who))
    shares = {n: share(n) for n in names}
    total_share = sum(shares.values()) or 1.0
    total_used = sum(used.get(n, 0.0) for n in names)
    out = {}
    for n in names:
        u = used.get(n, 0.0) / total_used if total_used > 0 else 0.0
        out[n] = math.pow(2.0, -u / (shares[n] / total_share))
    return out
