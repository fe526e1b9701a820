"""The node daemon's ``status`` reply: memory, jobs and their segments, workers, the
node's device tenants (one's own jobs only; root sees all), and the allocation it runs
in with the GPUs its step got (what the workers it starts inherit)."""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

from weave_slurm.node.autosave import AutosaveTimer
from weave_slurm.node.budget import MemoryBudget
from weave_slurm.node.index import JobRef
from weave_slurm.node.job_env import node_gpus
from weave_slurm.node.pool import ResidentPool
from weave_slurm.node.registry import JobRegistry
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.tenancy import DeviceTenancy


class Daemon(Protocol):
    """What ``status`` reads of its node daemon (``NodeDaemon``)."""

    store: SegmentStore
    budget: MemoryBudget
    registry: JobRegistry
    pool: ResidentPool | None
    autosave: AutosaveTimer
    tenancy: DeviceTenancy
    lock: threading.RLock

    def worker_json(self, job: JobRef) -> dict[str, Any] | None: ...


def node_status(d: Daemon, uid: int) -> dict[str, Any]:
    with d.lock:
        registered = [j for j in d.registry.jobs() if uid in (0, j.uid)]
        memory = d.budget.report().to_json()
    # the node's totals are public (as sinfo's are); per-job bytes only of one's own
    mine = {j.job_id for j in registered}
    per_job = memory["per_job_bytes"]
    assert isinstance(per_job, dict)
    memory["per_job_bytes"] = {k: v for k, v in per_job.items() if k in mine}
    jobs = []
    for job in registered:
        segs = {s.name: {"version": None if s.index is None else s.index.version,
                         "size_bytes": s.size_bytes, "problem": s.problem}
                for s in d.store.list_segments(job)}
        jobs.append({"job": job.job_id, "uid": job.uid, "segments": segs,
                     "worker": d.worker_json(job),
                     "resident": None if d.pool is None else d.pool.status(job),
                     "checkpoint_interval_s": d.autosave.interval_s(job.job_id)})
    device = d.tenancy.status()
    device["tenants"] = {k: v for k, v in device["tenants"].items() if k in mine}
    if uid != 0:
        device["last"] = None
    return {"root": str(d.store.root), "memory": memory, "jobs": jobs, "device": device,
            "allocation": os.environ.get("SLURM_JOB_ID"), "gpus": node_gpus(os.environ)}
