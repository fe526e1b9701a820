"""What a node daemon does when its allocation has ended (``weave node serve``, on the
signal or the allocation watch that says so) or weaved gives its node back to Slurm
(``Op.LEAVE``, :func:`leave`): it gives up its jobs' state and its root at once, and
serves nothing more."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import StateError, WeaveError
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


def leave(daemon: NodeDaemon, uid: int) -> dict[str, Any]:
    """``Op.LEAVE``: weaved is about to give this node back to Slurm while the rest of
    the allocation is held (a pooled group's spare node, daemon/allocplan.py "Spare
    nodes"). Slurm would SIGKILL this daemon's task there (``scontrol update
    JobId=X NodeList=...``), leaving its root in /dev/shm; so it ends itself first, as
    on the end of its allocation: every job's state dropped, the root removed, the
    process gone (``on_leave``, set by ``weave node serve``). Only weaved (root or this
    daemon's uid) may ask."""
    if uid not in (0, os.geteuid()):
        raise StateError(f"leave: only weaved (root or this daemon's uid) may ask; uid "
                         f"{uid} may not")
    if daemon.on_leave is None:
        raise StateError("leave: this node daemon does not run as its own process")
    daemon.on_leave("weaved gave this node back to Slurm")
    return {"leaving": True}

