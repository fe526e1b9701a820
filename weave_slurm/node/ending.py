"""What a node daemon does when its allocation has ended (``weave node serve``, on the
signal or the allocation watch that says so, or weaved gives its node back to Slurm:
node/leaving.py): it gives up its jobs' state and its root at once, and serves nothing
more."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from weave_slurm.errors import WeaveError
from weave_slurm.node.startup import remove_empty_root

if TYPE_CHECKING:
    from weave_slurm.node.daemon import NodeDaemon

log = logging.getLogger(__name__)


def end_allocation(daemon: NodeDaemon, why: str) -> None:
    """Remove every job's segments from this node: its allocation has ended, so weaved
    re-admits the members elsewhere from their checkpoints (on the shared file system,
    kept), and nothing here is read again; the host's memory is freed once the workers'
    mappings go with the shutdown that follows (docs/reliability.md, F17). The jobs are
    forgotten too, so that the shutdown leaves nothing of them (not even a ``.lock``
    or the registry) in /dev/shm (issue 33, defect 6 and C4).

    The daemon gives its root up at once, its lock file last (node/root_lock.py): Slurm
    kills what still runs KillWait after its SIGTERM, maybe before the shutdown's
    workers have stopped, and weaved's next allocation may start a daemon on this host
    and root meanwhile. From here on the daemon refuses every request (``ended``) and
    touches the root no more."""
    with daemon.lock:
        daemon.ended = f"its allocation no longer runs ({why})"
        jobs = sorted({*daemon.store.list_jobs(), *daemon.registry.jobs()},
                      key=lambda j: (j.uid, j.job_id))
        for job in jobs:
            try:
                daemon.store.delete_job(job)
            except WeaveError as exc:
                log.warning("node daemon: could not remove job %s's segments: %s",
                            job.job_id, exc)
                continue
            daemon.registry.remove(job.job_id)
        daemon.registry.save()
        remove_empty_root(daemon.config.root, daemon.root_lock)
    log.warning("node daemon: removed the segments of %d job(s): its allocation no longer "
                "runs (%s)", len(jobs), why)
