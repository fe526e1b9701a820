"""What a group's runtime measured goes back to the store (docs/daemon.md): a member's
recoveries so far, and its measured planning profile, which placement's later decisions
read (:func:`~weave_slurm.runtime.profiler.planning_profile`)."""

from __future__ import annotations

import logging

from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.store import Store
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.profiler import planning_profile

log = logging.getLogger(__name__)


def count(store: Store, member: MemberView | None, job: JobRow) -> None:
    """Store the member's recoveries so far: a restarted weaved counts on from them
    (its re-attach is one more), so a job's REASON counts them all."""
    if member is not None and member.recoveries != job.recoveries:
        store.set_recoveries(job.job_id, member.recoveries)


def feed_back(store: Store, member: MemberView | None, job: JobRow) -> None:
    """Store what the runtime measured as the job's planning profile, once it has
    enough samples and it moved (placement's later decisions read it)."""
    measured = None if member is None else member.measured
    if measured is None:
        return
    new = planning_profile(job.plan_profile, job.profile, measured)
    if new is not None:
        store.set_measured(job.job_id, new)
        log.info("job %s: planning profile from measurements: rollout %.3f/%.3f s, "
                 "train %.3f/%.3f s (mean/max)", job.job_id, new.rollout_mean_s,
                 new.rollout_max_s, new.train_mean_s, new.train_max_s)
