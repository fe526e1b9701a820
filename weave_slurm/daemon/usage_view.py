"""What ``weave sacct`` reads: the usage records of the jobs a caller may see, as sacct.

Access: a user sees their own jobs; root and the ``--admin-uid`` uids see everyone's
(``users`` filters them). Asking for another user's usage without being an admin is
refused; job ids of other users' jobs are left out, as sacct does. A job is listed if
its time (submitted until ended, or now) overlaps ``[start_s, end_s]``; its record is
its totals so far (docs/accounting.md).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon.protocol import PermissionDenied
from weave_slurm.daemon.records import AllocRow, JobRow, UsageRow, by_group
from weave_slurm.daemon.states import AllocState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.usage_sql import slurm_order
from weave_slurm.errors import ConfigError

_LIVE_ALLOC = (AllocState.ALLOCATING, AllocState.HELD, AllocState.RELEASING)


def slurm_job_ids(job: JobRow, allocs: Sequence[AllocRow], usage: UsageRow | None) -> list[str]:
    """The Slurm job ids of a job's allocations: those it was charged for, and while it
    is in its group, the group's allocations held (or being asked for) now."""
    if usage is None and not allocs:
        return []   # not placed yet (the common case in a long queue): nothing to say
    ids = set(usage.alloc_ids) if usage is not None else set()
    if not job.state.final:
        ids |= {a.alloc_id for a in allocs if a.alloc_id and a.state in _LIVE_ALLOC}
    return sorted(ids, key=slurm_order)


def _time(args: dict[str, Any], key: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise ConfigError(f"sacct: field {key!r} must be seconds since the epoch, got "
                          f"{value!r}")
    return float(value)


def _strings(args: dict[str, Any], key: str) -> list[str]:
    raw = args.get(key) or []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(f"sacct: field {key!r} must be a list of user names, got {raw!r}")
    return raw


def _ids(args: dict[str, Any]) -> set[int]:
    raw = args.get("jobs") or []
    if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in raw):
        raise ConfigError(f"sacct: field 'jobs' must be a list of job ids, got {raw!r}")
    return set(raw)


def _visible(uid: int, admins: Collection[int], users: list[str], name: str) -> list[str]:
    """The user filter the caller may apply (refused: another user's, unless admin)."""
    if uid in admins:
        return users
    others = [u for u in users if u not in (name, str(uid))]
    if others:
        raise PermissionDenied(f"Access/permission denied: uid {uid} ({name}) may see only "
                               f"its own usage, not {others[0]}'s; root and the admin uids "
                               "see everyone's")
    return [str(uid)]


def sacct(store: Store, site: SiteConfig, uid: int, name: str, admins: Collection[int],
          args: dict[str, Any], now: float) -> dict[str, Any]:
    """The ``sacct`` reply: one record per visible job (module doc)."""
    users = _visible(uid, admins, _strings(args, "users"), name)
    ids = _ids(args)
    start_s, end_s = _time(args, "start_s"), _time(args, "end_s")
    if start_s is not None and end_s is not None and end_s < start_s:
        raise ConfigError("sacct: the end time is before the start time; give -E after -S")
    usage = store.usage()
    allocs = by_group(store.allocs(live_only=False))
    rows = []
    for job in store.jobs():
        if (users and job.user not in users and str(job.uid) not in users) \
                or (ids and job.job_id not in ids):
            continue
        ended = job.ended_s if job.ended_s is not None else now
        if (end_s is not None and job.submitted_s > end_s) \
                or (start_s is not None and ended < start_s):
            continue
        rows.append(record(job, allocs.get(job.group_id or -1, []), usage.get(job.job_id)))
    return {"jobs": rows, "now": now, "currency": site.currency,
            "partitions": {"rollout": site.rollout.partition, "train": site.train.partition}}


def record(job: JobRow, allocs: Sequence[AllocRow], usage: UsageRow | None) -> dict[str, Any]:
    """One job's accounting record (the fields ``weave sacct -o`` shows)."""
    charged = [a for a in allocs if a.alloc_id in set(slurm_job_ids(job, allocs, usage))]
    u = usage
    return {"job": job.job_id, "name": job.name, "user": job.user, "uid": job.uid,
            "group": job.group_id, "state": job.state.value, "submitted_s": job.submitted_s,
            "started_s": job.started_s, "ended_s": job.ended_s,
            "account": _joined(a.account for a in charged),
            "qos": _joined(a.qos for a in charged),
            "time_limit_min": max((a.time_limit_min for a in charged
                                   if a.time_limit_min is not None), default=None),
            "slurm_job_ids": slurm_job_ids(job, allocs, usage),
            "gpu_s": dict(u.gpu_s) if u else {"rollout": 0.0, "train": 0.0},
            "node_s": dict(u.node_s) if u else {"rollout": 0.0, "train": 0.0},
            "phase_s": dict(u.phase_s) if u else {"rollout": 0.0, "sync": 0.0, "train": 0.0},
            "cost": u.cost if u else 0.0, "updated_s": u.updated_s if u else None}


def _joined(values: Any) -> str | None:
    seen = sorted({v for v in values if v})
    return ",".join(seen) if seen else None
