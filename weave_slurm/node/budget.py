"""Host-memory accounting for the warm state a node holds.

Every segment is charged its full size before it is written; a charge that would take
the node past its budget is refused. The budget is ``host_mem_gib`` from the site
config (the DRAM a node may spend on warm state), passed in as a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources
from weave_slurm.node.index import JobRef

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryReport:
    """Used and free bytes of the node budget, and the bytes of each job."""

    limit_bytes: int
    used_bytes: int
    per_job_bytes: dict[str, int]

    @property
    def free_bytes(self) -> int:
        return self.limit_bytes - self.used_bytes

    def to_json(self) -> dict[str, object]:
        return {"limit_bytes": self.limit_bytes, "used_bytes": self.used_bytes,
                "free_bytes": self.free_bytes, "per_job_bytes": dict(self.per_job_bytes)}


class MemoryBudget:
    """Charges per (job, segment); not thread-safe (the daemon holds its own lock)."""

    def __init__(self, host_mem_gib: float) -> None:
        if not host_mem_gib > 0:
            raise ConfigError(f"host_mem_gib {host_mem_gib!r} must be > 0")
        self.limit_bytes = int(host_mem_gib * GIB)
        self._charges: dict[tuple[JobRef, str], int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._charges.values())

    def charged(self, job: JobRef, name: str) -> int:
        return self._charges.get((job, name), 0)

    def check(self, job: JobRef, name: str, nbytes: int) -> None:
        """Raise unless segment ``name`` of ``job`` may grow (or shrink) to ``nbytes``."""
        if nbytes < 0:
            raise ConfigError(f"segment {job.job_id}/{name}: nbytes {nbytes!r} must be >= 0")
        if nbytes > self.limit_bytes:
            raise InfeasibleRequest(
                f"segment {job.job_id}/{name} needs {nbytes / GIB:.3f} GiB, more than this "
                f"node's whole warm-state budget host_mem_gib={self.limit_bytes / GIB:.3f}; "
                "shard the state over more nodes")
        after = self.used_bytes - self.charged(job, name) + nbytes
        if after > self.limit_bytes:
            free = self.limit_bytes - self.used_bytes
            raise InsufficientResources(
                f"segment {job.job_id}/{name} needs {nbytes / GIB:.3f} GiB but only "
                f"{free / GIB:.3f} GiB of host_mem_gib={self.limit_bytes / GIB:.3f} is free "
                "on this node; drop a job or retry later")

    def charge(self, job: JobRef, name: str, nbytes: int) -> None:
        self.check(job, name, nbytes)
        self._charges[(job, name)] = nbytes

    def force(self, job: JobRef, name: str, nbytes: int) -> None:
        """Record state that already exists (re-adopted after a restart), even over budget."""
        self._charges[(job, name)] = nbytes

    def release(self, job: JobRef, name: str) -> None:
        self._charges.pop((job, name), None)

    def release_job(self, job: JobRef) -> None:
        for key in [k for k in self._charges if k[0] == job]:
            del self._charges[key]

    def report(self) -> MemoryReport:
        per_job: dict[str, int] = {}
        for (job, _), n in self._charges.items():
            per_job[job.job_id] = per_job.get(job.job_id, 0) + n
        return MemoryReport(self.limit_bytes, self.used_bytes, per_job)
