"""What a node daemon keeps at start: adopt the valid state of registered jobs, clean the rest.

Rules (applied under the node lock, before the socket is served):

1. A job directory whose job is not in the registry is removed whole.
2. In a registered job: half-written ``*.tmp-<pid>`` files are removed, a segment whose
   index is missing, corrupt, incomplete or disagrees with the data size is removed,
   and an index without data is removed.
3. Every other segment is adopted: the budget is charged its size.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.node.index import JobRef, is_scratch
from weave_slurm.node.root_lock import NAME as LOCK_NAME
from weave_slurm.node.root_lock import RootLock
from weave_slurm.node.segments import INDEX_SUFFIX, SegmentListing, SegmentStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartupReport:
    adopted: tuple[SegmentListing, ...]
    removed: tuple[Path, ...]


def recover_store(store: SegmentStore, registered: set[JobRef]) -> StartupReport:
    """Scan the store's root and make it hold only valid state of registered jobs."""
    adopted: list[SegmentListing] = []
    removed: list[Path] = []
    for job in store.list_jobs():
        if job not in registered:
            log.warning("removing stale state of unregistered job %s (uid %d)",
                        job.job_id, job.uid)
            removed.append(store.job_dir(job))
            store.delete_job(job)
            continue
        removed.extend(store.remove_temporaries(job))
        names: set[str] = set()
        for seg in store.list_segments(job):
            names.add(seg.name)
            if seg.problem is None and is_scratch(seg.name):
                seg = dataclasses.replace(seg, problem="a worker's switched-out device "
                                          "state (its worker is gone)")
            if seg.problem is None:
                adopted.append(seg)
                continue
            log.warning("removing segment %s: %s", seg.seg_path, seg.problem)
            store.delete_segment(job, seg.name)
            removed.append(seg.seg_path)
        for orphan in store.job_dir(job).glob(f"*{INDEX_SUFFIX}"):
            if orphan.name.removesuffix(INDEX_SUFFIX) not in names:
                orphan.unlink(missing_ok=True)
                removed.append(orphan)
    for job in registered:
        if not store.job_dir(job).is_dir():
            store.ensure_job_dir(job)
    return StartupReport(tuple(adopted), tuple(removed))


#: What a node daemon itself keeps in its root beside its life lock (``root_lock``): the
#: job registry and its lock.
DAEMON_FILES = ("registry.json", ".lock")


def remove_empty_root(root: Path, lock: RootLock | None = None) -> bool:
    """At a clean stop with no job registered: remove the daemon's own files and every
    empty directory under ``root``, then ``root`` itself, so a node the group let go of
    keeps nothing in ``/dev/shm``. A segment still there (a job the registry does not
    know) is kept and logged. True if ``root`` is gone.

    The root's life lock file goes last, and only with the held ``lock`` of a daemon
    that is ending (``root_lock``: removed any earlier, a second daemon could serve the
    root beside this one); without it the lock file and the root stay."""
    for name in DAEMON_FILES:
        (root / name).unlink(missing_ok=True)
    if not root.is_dir():
        return True
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            try:
                path.rmdir()            # only if empty
            except OSError:
                continue
        elif path.name == ".lock" and not any(   # a job directory's own lock, alone
                p.name != ".lock" for p in path.parent.iterdir()):
            path.unlink(missing_ok=True)
            path.parent.rmdir()
    if lock is None:
        return False
    lock.release(remove=True)
    try:
        root.rmdir()
    except OSError:
        left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        if left != [LOCK_NAME]:     # not just the lock of a daemon started meanwhile
            log.warning("node root %s: kept at stop, it still holds %s", root,
                        ", ".join(left[:5]) or "directories")
        return False
    return True
