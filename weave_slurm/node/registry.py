"""The node daemon's persistent list of registered jobs (``<root>/registry.json``).

It survives a daemon crash so that, at the next start, warm state of jobs that are
still registered is re-adopted and everything else is cleaned. Written atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.errors import StateError
from weave_slurm.node.index import JobRef


@dataclass(frozen=True)
class JobRecord:
    job: JobRef
    registered_s: float
    checkpoint_interval_s: float | None = None   # None: the daemon's default


class JobRegistry:
    """Registered jobs by id; one job id belongs to exactly one uid."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._jobs: dict[str, JobRecord] = {}

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
            self._jobs = {
                jid: JobRecord(JobRef(jid, int(r["uid"])), float(r["registered_s"]),
                               None if r.get("checkpoint_interval_s") is None
                               else float(r["checkpoint_interval_s"]))
                for jid, r in raw["jobs"].items()}
        except FileNotFoundError:
            self._jobs = {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"job registry {self.path} is corrupt ({exc}); move it "
                             "aside to start with no registered jobs") from exc

    def save(self) -> None:
        body = {"jobs": {jid: {"uid": r.job.uid, "registered_s": r.registered_s,
                               "checkpoint_interval_s": r.checkpoint_interval_s}
                         for jid, r in sorted(self._jobs.items())}}
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(body, indent=1).encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def get(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def add(self, record: JobRecord) -> None:
        self._jobs[record.job.job_id] = record

    def remove(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def jobs(self) -> list[JobRef]:
        return [r.job for r in self._jobs.values()]
