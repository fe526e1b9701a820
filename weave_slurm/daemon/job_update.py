"""``weave update ID``: change what a job asked for, as ``scontrol update JobId=...``.

- ``name``: any job that has not ended;
- ``time`` (its time limit, sbatch's forms): any job that has not ended; as Slurm, its
  user may lower it, only an admin may raise it or lift it, and never past the site's
  ``[slurm] time_limit_min``;
- ``slo``: a PENDING job only (a placed job's group was planned with its SLO).

Each update is one row of the job's history (a transition to the state it is in, with
what changed), written only if the job is still in a state the change is allowed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from weave_slurm.config.job import NAME_RE
from weave_slurm.config.sbatch import parse_time_min, refuse_over_site
from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon.protocol import PermissionDenied
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import AlreadyEnded, ConfigError, StateError

_NOT_ENDED = tuple(s for s in JobState if not s.final)
FIELDS = ("name", "time", "slo")


def update_job(store: Store, site: SiteConfig, uid: int, admins: Collection[int],
               args: dict[str, Any], now: float) -> dict[str, Any]:
    """Apply ``args`` (``job`` and any of :data:`FIELDS`) to one job (module doc)."""
    job_id = args.get("job")
    if not isinstance(job_id, int) or isinstance(job_id, bool):
        raise ConfigError(f"update: 'job' must be a job id, got {job_id!r}")
    asked = {k: v for k, v in args.items() if k in FIELDS and v is not None}
    if not asked:
        raise ConfigError(f"update: nothing to change; give any of {', '.join(FIELDS)}")
    job = store.job(job_id)
    if job is None:
        raise ConfigError(f"Invalid job id specified: {job_id}")
    if uid not in admins and uid != job.uid:
        raise PermissionDenied(f"Access/permission denied for job {job_id} (owned by "
                               f"{job.user})")
    if job.state.final:
        raise AlreadyEnded(f"Job {job_id} already {job.state.value.lower()}")
    spec, profile = job.readable_spec(), job.profile
    changes: list[str] = []
    expect: tuple[JobState, ...] = _NOT_ENDED
    if "name" in asked:
        name = str(asked["name"])
        if not NAME_RE.match(name):
            raise ConfigError(f"update: name {name!r} must be 1-64 characters of letters, "
                              "digits, '.', '_' or '-', starting with a letter or digit")
        changes.append(f"name {spec.name} -> {name}")
        spec = dataclasses.replace(spec, name=name)
    if "time" in asked:
        limit = _time_limit(job, str(asked["time"]), uid in admins, site)
        changes.append(f"time limit {_minutes(spec.slurm.time_limit_min)} -> "
                       f"{_minutes(limit)}")
        spec = dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm,
                                                                   time_limit_min=limit))
    if "slo" in asked:
        slo = asked["slo"]
        if isinstance(slo, bool) or not isinstance(slo, int | float) or not slo >= 1.0:
            raise ConfigError(f"update: slo {slo!r} must be a number >= 1.0")
        if job.state is not JobState.PENDING:
            raise StateError(f"Job {job_id} is {job.state.value}: only a pending job's SLO "
                             "can change (its group was planned with it)")
        changes.append(f"slo {profile.slo:g} -> {float(slo):g}")
        spec = dataclasses.replace(spec, slo=float(slo))
        profile = dataclasses.replace(profile, slo=float(slo))
        expect = (JobState.PENDING,)
    store.update_job(job_id, spec=spec, profile=profile, now=now, expect=expect,
                     reason=f"updated by uid {uid}: {'; '.join(changes)}")
    return {"job": job_id, "changes": changes}


def _time_limit(job: JobRow, text: str, admin: bool, site: SiteConfig) -> int | None:
    try:
        limit = parse_time_min(text)
    except ConfigError as exc:
        raise ConfigError(f"update: time {text!r}: {exc}") from None
    old = job.readable_spec().slurm.time_limit_min
    raises = limit is None or (old is not None and limit > old)
    if raises and not admin:
        raise PermissionDenied(f"update of job {job.job_id}: only an admin may raise or "
                               f"lift its time limit ({_minutes(old)}), as Slurm")
    refuse_over_site(dataclasses.replace(job.readable_spec().slurm, time_limit_min=limit),
                     site.slurm, f"update of job {job.job_id}")
    return limit


def _minutes(limit: int | None) -> str:
    return "UNLIMITED" if limit is None else f"{limit} min"
