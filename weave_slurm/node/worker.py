"""Phase workers: the processes a node daemon starts to run one job's phase.

A worker is a command (argv) run as the job's uid in its own session, with the
``WEAVE_*`` environment below pointing at the job's segments. The warm state lives in
the segments, not in the worker, so a worker that crashes (even ``kill -9``) leaves
the state exactly as it was; the daemon only records how the worker ended.

Worker environment::

    WEAVE_NODE_ROOT     the segment store root
    WEAVE_NODE_SOCKET   the node daemon's socket
    WEAVE_JOB_ID        the job
    WEAVE_JOB_UID       its owner
    WEAVE_JOB_DIR       <root>/<uid>/<job_id>
    WEAVE_PHASE         rollout | sync | train
    WEAVE_SEGMENTS      JSON: segment name -> path of its .seg file
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import WorkerState, WorkerStatus
from weave_slurm.node.segments import AttachedState, SegmentStore
from weave_slurm.vocab import Phase


class WorkerKind(StrEnum):
    """How a job's current phase runs on the node."""

    PROCESS = "process"      # a PhaseWorker: a fresh process started from the request's argv
    RESIDENT = "resident"    # an activation of the job's pre-forked resident worker (pool)
    EXTERNAL = "external"    # a gate grant to a cooperative job's own process (gate_ops)


def job_segments(store: SegmentStore, job: JobRef) -> dict[str, Path]:
    """The job's segments an activation hands its worker: those with an index."""
    return {s.name: s.seg_path for s in store.list_segments(job) if s.index is not None}


def worker_env(store: SegmentStore, job: JobRef, phase: Phase, socket_path: Path,
               segments: Mapping[str, Path]) -> dict[str, str]:
    return {
        "WEAVE_NODE_ROOT": str(store.root), "WEAVE_NODE_SOCKET": str(socket_path),
        "WEAVE_JOB_ID": job.job_id, "WEAVE_JOB_UID": str(job.uid),
        "WEAVE_JOB_DIR": str(store.job_dir(job)), "WEAVE_PHASE": phase.value,
        "WEAVE_SEGMENTS": json.dumps({k: str(v) for k, v in segments.items()}),
    }


class PhaseWorker:
    """One started worker process of one job."""

    def __init__(self, job: JobRef, phase: Phase, argv: list[str], env: Mapping[str, str],
                 log_path: Path) -> None:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"activate of job {job.job_id!r}: 'argv' must be a non-empty "
                              f"list of strings, got {argv!r}")
        self.job = job
        self.phase = phase
        self.log_path = log_path
        self.started_s = time.time()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        if os.geteuid() == 0 and job.uid != 0:
            os.fchown(fd, job.uid, -1)
        as_user = job.uid if os.geteuid() == 0 and job.uid != 0 else None
        try:
            self._proc = subprocess.Popen(
                argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=fd,
                stderr=subprocess.STDOUT, start_new_session=True, user=as_user,
                cwd=str(log_path.parent))
        except OSError as exc:
            raise ConfigError(f"activate of job {job.job_id!r}: cannot start "
                              f"{argv[0]!r}: {exc}") from exc
        finally:
            os.close(fd)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def status(self) -> WorkerStatus:
        rc = self._proc.poll()
        if rc is None:
            state = WorkerState.RUNNING
        elif rc == 0:
            state = WorkerState.EXITED
        else:
            state = WorkerState.FAILED if rc > 0 else WorkerState.KILLED
        return WorkerStatus(self.job.job_id, self.phase, self._proc.pid, state, rc,
                            self.started_s, str(self.log_path))

    def stop(self, timeout_s: float = 10.0) -> WorkerStatus:
        """SIGTERM the worker's process group, SIGKILL it after ``timeout_s``."""
        if self._proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._proc.wait()
        return self.status()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)


def attach_from_env(env: Mapping[str, str] | None = None) -> dict[str, AttachedState]:
    """In a worker: attach every segment named in ``WEAVE_SEGMENTS`` zero-copy."""
    env = os.environ if env is None else env
    try:
        store = SegmentStore(Path(env["WEAVE_NODE_ROOT"]))
        job = JobRef(env["WEAVE_JOB_ID"], int(env["WEAVE_JOB_UID"]))
        names = json.loads(env["WEAVE_SEGMENTS"])
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"worker environment is incomplete ({exc}); start workers "
                          "through the node daemon's activate request") from exc
    return {name: store.attach_state(job, name) for name in names}
