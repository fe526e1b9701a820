"""A hosted job's ``--output`` and ``--error`` (``#SBATCH -o/-e``): its log, kept by weaved.

A hosted job's processes are weave's resident workers on the group's nodes, shared
with other users' jobs, and what they print goes to ``resident.log`` in the job's
directory under each node daemon's shared-memory root (``node/pool.py``), which lives
and dies with the node's ``/dev/shm``. What a user expects in the file sbatch's
``--output`` names is what the job did: so weaved writes there, one line per event,

- each state change of the job with its reason (``PENDING``, ``PLACED into group 3``,
  ``RUNNING``, ``COMPLETED reached version 10/10``, ``FAILED reached its time limit``);
- each training step the runtime reports (``step 3/10 reward 0.4123``), and each
  recovery or error of its member.

Lines of failures (a FAILED, REFUSED or CANCELLED state, a member's error or recovery)
also go to ``--error`` when it names another file (as sbatch: without ``--error`` both
streams are in ``--output``). Paths are expanded by :func:`weave_slurm.config.sbatch.
log_path` (``%j`` the weave job id, ``%u``, ``%x``), relative ones against the job's
``workdir`` (else the user's home). A job naming neither writes to ``weave-%j.out``
there (:data:`~weave_slurm.config.launch.DEFAULT_OUTPUT`, as sbatch's ``slurm-%j.out``;
a cooperative job's processes too). Each file is opened (append, created 0644) **as
the job's uid**, in a child that became it and passes the descriptor back, so weaved
never writes where the user could not; a file that cannot be opened is said once in
weaved's log and in the job's ``reason`` (the job runs on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weave_slurm.config.launch import DEFAULT_OUTPUT
from weave_slurm.config.sbatch import JobSlurm, host_path, log_path
from weave_slurm.daemon.job_terms import JobTerms
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.node.open_as import open_as
from weave_slurm.runtime.launch_plan import plan_for

log = logging.getLogger(__name__)

#: Opens ``path`` for appending as ``uid``; returns a descriptor (OSError when it cannot).
Opener = Callable[[int, str], int]
_FAILED = ("FAILED", "REFUSED", "CANCELLED")
_LIVE = [JobState.PENDING, JobState.PLACED, JobState.RUNNING, JobState.CANCELLING]


@dataclass
class _Log:
    """Where one job's lines go, and how far they are written."""

    out: int | None = None
    err: int | None = None
    written: int = 0              # transitions written
    version: int | None = None    # last step written
    said: set[str] = field(default_factory=set)   # member events written
    broken: bool = False


class JobOutputs:
    """Writes each hosted job's events to its ``--output``/``--error`` (one act a tick)."""

    def __init__(self, store: Store, terms: JobTerms,
                 live: Callable[[int], dict[str, Any] | None], opener: Opener = open_as,
                 wall: Callable[[float], str] | None = None) -> None:
        self.store, self.terms, self.live, self.opener = store, terms, live, opener
        self.wall = wall or _stamp
        self._logs: dict[int, _Log] = {}
        self._done: set[int] = set()
        # this weaved's first tick: a job submitted before it had its earlier lines
        # written by the weaved before (a restart writes nothing twice)
        self.since: float | None = None

    def advance(self, now: float) -> None:
        """Write what happened to each job naming an output file since the last tick."""
        if self.since is None:
            self.since = now
        jobs = {j.job_id: j for j in self.store.jobs(_LIVE)}
        for job_id in set(self._logs) - set(jobs):   # ended since: their last lines
            row = self.store.job(job_id)
            if row is not None:
                jobs[job_id] = row
        for job in jobs.values():
            if job.job_id in self._done:
                continue
            if job.job_id not in self._logs and not _hosted(job):
                self._done.add(job.job_id)   # a cooperative job: its processes write them
                continue
            state = self._logs.get(job.job_id) or self._open(job)
            if not state.broken:
                self._write(job, state, now)
            if job.state.final:
                self._close(job.job_id)

    def _open(self, job: JobRow) -> _Log:
        terms, state = self.terms.of(job), _Log()
        self._logs[job.job_id] = state
        if self.since is not None and job.submitted_s < self.since:
            state.written = sum(t.ts < self.since
                                for t in self.store.transitions("job", job.job_id))
        try:
            # weaved's event lines: %N is weaved's host (each node's workers: theirs)
            out_path, err_path = (None if p is None else host_path(p, socket.gethostname())
                                  for p in hosted_paths(job, terms))
            if out_path is not None:
                state.out = self.opener(job.uid, out_path)
            if err_path is not None and err_path != out_path:
                state.err = self.opener(job.uid, err_path)
        except OSError as exc:
            self._broken(job, state, f"cannot open its output file: {exc}")
        return state

    def _broken(self, job: JobRow, state: _Log, what: str) -> None:
        """Its output files are given up: said in weaved's log and in the job's REASON
        (after why it ended, for an ended job)."""
        log.warning("job %s: %s", job.job_id, what)
        state.broken = True
        self.store.update("job", job.job_id,
                          reason=f"{job.reason}; {what}" if job.reason else what)

    def _write(self, job: JobRow, state: _Log, now: float) -> None:
        if job.state.final:   # what it did before it ended, then how it ended
            self._progress(job, state, now)
        rows = self.store.transitions("job", job.job_id)
        for row in rows[state.written:]:
            what = f"{row.dst}" + (f": {row.reason}" if row.reason else "")
            self._line(job, state, row.ts, what, failure=row.dst in _FAILED)
        state.written = len(rows)
        if job.state is JobState.RUNNING:
            self._progress(job, state, now)

    def _progress(self, job: JobRow, state: _Log, now: float) -> None:
        """The steps the runtime reported since the last tick, and what it said; for a
        job that ended in this tick, up to its end (a step it took just before it is
        written too)."""
        live = self.live(job.job_id)
        if live is None:
            return
        version = live.get("version")
        if isinstance(version, int) and version != state.version and version > 0:
            reward = live.get("reward")
            shown = f" reward {reward:.4f}" if isinstance(reward, float) else ""
            self._line(job, state, now, f"step {version}/{live.get('iterations')}"
                       f"{shown}", failure=False)
            state.version = version
        for key in ("event", "error"):
            said = live.get(key)
            if isinstance(said, str) and said and said not in state.said:
                state.said.add(said)
                self._line(job, state, now, f"{key}: {said}", failure=True)

    def _line(self, job: JobRow, state: _Log, ts: float, what: str, failure: bool) -> None:
        text = f"{self.wall(ts)} weave job {job.job_id} ({job.name}): {what}\n".encode()
        targets = [state.out] + ([state.err] if failure else [])
        if state.out is None:
            targets = [state.err]
        for fd in targets:
            if fd is not None:
                try:
                    os.write(fd, text)
                except OSError as exc:
                    self._broken(job, state, f"writing its output file: {exc}")
                    return

    def _close(self, job_id: int) -> None:
        state = self._logs.pop(job_id, None)
        self._done.add(job_id)
        for fd in (state.out, state.err) if state else ():
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        for job_id in list(self._logs):
            self._close(job_id)


def hosted_paths(job: JobRow, terms: JobSlurm) -> tuple[str | None, str | None]:
    """``--output`` (default ``weave-%j.out``) and ``--error`` (None: not named) of
    ``job`` (its ``[slurm]`` ``terms``) as absolute paths: weaved's event lines and the
    job's workers' stdout/stderr (``node/job_streams.py``, through
    ``MemberSpec.output/error``) go to the same files."""
    base = _workdir(job)
    out, err = (log_path(p, job_id=job.job_id, user=job.user, job_name=job.name,
                         workdir=base, array_job=terms.array_job,
                         array_task=terms.array_task) if p else None
                for p in (terms.output or DEFAULT_OUTPUT, terms.error))
    return out, err


def log_files(job: JobRow) -> tuple[str | None, str | None]:
    """Where the job's output and errors go, as ``weave show job`` and ``weave logs`` say
    (``StdOut``/``StdErr`` of scontrol): its ``--output``/``--error`` (``weave-%j.out``
    by default); errors with the output when ``--error`` names no other file (``%N``
    shown as it is: each host writes its own)."""
    if job.spec is None:
        return None, None
    if job.spec.launch is None:
        out, err = hosted_paths(job, job.spec.slurm)
    else:
        plan = plan_for(job.spec, str(job.job_id), job.uid)
        out, err = (plan.output, plan.error) if plan is not None else (None, None)
    shown = [None if p is None else host_path(p, "%N") for p in (out, err)]
    return shown[0], shown[1] or shown[0]


def _hosted(job: JobRow) -> bool:
    """A hosted job (weave's workers), not a cooperative one (``[launch]``)."""
    return job.spec is None or job.spec.launch is None   # None: stored by an older weaved


def _workdir(job: JobRow) -> str | None:
    """What a relative output name is relative to: the job's workdir, else its user's
    home (as a cooperative job's, ``runtime/launch_plan.py``)."""
    workdir = job.spec.workdir if job.spec is not None else None
    if workdir is None:
        with contextlib.suppress(KeyError):
            workdir = pwd.getpwuid(job.uid).pw_dir
    return workdir


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))
