"""Which member holds a node's device memory, and switching it out for another.

Every resident activation names its **tenant** (the member it serves: a gang's ranks
and engines on one node share their job's tenant). Before a phase of one tenant
starts, :meth:`DeviceTenancy.make_room` runs the switch-out entry
(:data:`SWITCH_OUT_ENTRY`: :func:`weave_slurm.hosted.phases.switch_out`) in the
resident worker of every job of another tenant whose last phase reported device memory held
(``device_held_bytes`` in its result) and waits for it, so that the incoming phase
finds the GPUs free. The same tenant running again moves nothing.

A switch-out that fails or does not end within ``timeout_s`` kills that worker (its
state is in the node's segments; the member's next phase rebuilds from them): the
incoming phase is never refused for another member's fault. The page-locked host
memory a job's own offload keeps (``host_bytes``: DeepSpeed's ``offload_states``) is
charged to the node's budget until that job's next phase; a worker's pinned staging
buffer (``staging_bytes``, only where registering a segment failed) for good.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from weave_slurm.errors import WeaveError
from weave_slurm.node.budget import MemoryBudget
from weave_slurm.node.index import JobRef
from weave_slurm.node.pool import ResidentPool
from weave_slurm.node.pool_records import ResidentState
from weave_slurm.node.protocol import WorkerState
from weave_slurm.node.registry import JobRegistry
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.worker import job_segments, worker_env

log = logging.getLogger(__name__)

SWITCH_OUT_ENTRY = "weave_slurm.hosted.phases:switch_out"
#: the budget's names for a job's page-locked host memory outside its segments: what
#: its own offload keeps while it is out, and its worker's staging buffer (kept)
PINNED = "device.pinned"
STAGING = "device.staging"
_POLL_S = 0.002
_LOCK_WAIT_S = 30.0   # a holder's worker lock is held only by short requests


class Daemon(Protocol):
    """What the tenancy uses of its node daemon (``NodeDaemon``)."""

    store: SegmentStore
    budget: MemoryBudget
    registry: JobRegistry
    pool: ResidentPool | None
    lock: threading.RLock

    def worker_lock(self, job_id: str) -> threading.RLock: ...


class DeviceTenancy:
    """The node's device tenants (thread-safe; one switch at a time)."""

    def __init__(self, daemon: Daemon, socket_path: Path, timeout_s: float = 300.0) -> None:
        self.daemon = daemon
        self.socket_path = socket_path
        self.entry = SWITCH_OUT_ENTRY     # what runs in the worker (a seam for tests)
        self.timeout_s = timeout_s
        self._tenant: dict[str, str] = {}
        self._code: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._switching = threading.Lock()
        self.switched = 0                 # switch-outs run (status)
        self.last: dict[str, Any] | None = None

    def forget(self, job: JobRef) -> None:
        with self._lock:
            self._tenant.pop(job.job_id, None)
            self._code.pop(job.job_id, None)

    def make_room(self, job: JobRef, tenant: str, code: dict[str, Any]) -> None:
        """Switch out the other tenants' jobs that hold device memory, then make
        ``job`` (with the code its worker runs: python, pythonpath, workdir) a tenant."""
        with self._switching:
            with self._lock:
                others = [(j, self._code[j]) for j, t in self._tenant.items()
                          if t != tenant and j != job.job_id]
            for job_id, held_code in others:
                self._switch_out(job_id, held_code, tenant)
            with self._lock:
                self._tenant[job.job_id], self._code[job.job_id] = tenant, code
            with self.daemon.lock:       # its own offload ends with its next phase
                self.daemon.budget.release(job, PINNED)

    def _switch_out(self, job_id: str, code: dict[str, Any], incoming: str) -> None:
        d, pool = self.daemon, self.daemon.pool
        record = d.registry.get(job_id)
        if record is None or pool is None:
            return
        ref = record.job
        last = pool.last(ref)
        alive = (pool.status(ref) or {}).get("worker_state") == ResidentState.IDLE.value
        if last is None or not alive or not _holds(last.result) \
                or last.state is not WorkerState.EXITED:
            if last is not None and last.state is WorkerState.RUNNING:
                log.warning("job %s still runs %s while %s starts on this node: its "
                            "device memory is not switched out", job_id,
                            last.phase.value, incoming)
            return
        lock = d.worker_lock(job_id)
        if not lock.acquire(timeout=min(self.timeout_s, _LOCK_WAIT_S)):
            log.warning("job %s: its worker is busy; not switched out", job_id)
            return
        start = time.monotonic()
        try:
            segments = job_segments(d.store, ref)
            env = worker_env(d.store, ref, last.phase, self.socket_path, segments)
            try:
                act = pool.activate(ref, last.phase, {
                    "entry": self.entry, "args": [], "env": env,
                    "root": str(d.store.root),
                    "segments": {k: str(v) for k, v in segments.items()},
                    "pythonpath": list(code.get("pythonpath") or []),
                    **{k: code.get(k) for k in ("python", "workdir", "container")},
                    # in a container its files' directories are part of its zygote's key
                    **({k: code.get(k) for k in ("output", "error")}
                       if code.get("container") else {})})
            except WeaveError as exc:
                log.error("job %s: no switch-out for %s (%s); killing its worker",
                          job_id, incoming, exc)
                self._kill(ref)
                return
            while act.state is WorkerState.RUNNING and \
                    time.monotonic() - start < self.timeout_s:
                time.sleep(_POLL_S)
            if act.state is not WorkerState.EXITED:
                why = act.error or f"no answer in {self.timeout_s:g} s"
                log.error("job %s: switch-out for %s failed (%s); killing its worker, "
                          "which frees its device memory", job_id, incoming, why)
                self._kill(ref)
                return
            result = act.result if isinstance(act.result, dict) else {}
            host = int(result.get("host_bytes") or 0)
            staging = int(result.get("staging_bytes") or 0)
            with d.lock:
                if host > 0:
                    d.budget.force(ref, PINNED, host)
                if staging > 0:
                    d.budget.force(ref, STAGING, staging)
            self.switched += 1
            self.last = {"job": job_id, "for": incoming,
                         "seconds": round(time.monotonic() - start, 6), **result}
            log.info("job %s switched out for %s in %.3f s", job_id, incoming,
                     time.monotonic() - start)
        finally:
            lock.release()

    def _kill(self, ref: JobRef) -> None:
        pool = self.daemon.pool
        info = pool.status(ref) if pool is not None else None
        pid = (info or {}).get("pid")
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"tenants": dict(self._tenant), "switched": self.switched,
                    "last": self.last}


def _holds(result: object) -> bool:
    return isinstance(result, dict) and bool(result.get("device_held_bytes"))
