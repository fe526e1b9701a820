"""The Slurm backend over the command-line tools (the default door to a real Slurm).

``sbatch --parsable`` of the rendered allocation template (:mod:`.templates`) holds
allocations, ``srun --jobid=<id> --overlap --exact`` runs steps in the background,
``scancel`` ends both, ``squeue --json`` / ``squeue --steps`` / ``sinfo --json`` read the
world. Every command goes through
the injected :class:`~weave_slurm.slurm.command_runner.CommandRunner`.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources, StateError
from weave_slurm.slurm import squeue
from weave_slurm.slurm.backend import (
    NAME_PREFIX,
    Allocation,
    AllocationRequest,
    AllocationState,
    NodeInfo,
    StepHandle,
    StepInfo,
    StepSpec,
    StepState,
    StepStatus,
)
from weave_slurm.slurm.command_runner import (
    BackgroundProcess,
    CommandRunner,
    PipedProcess,
    SlurmCommandError,
    SubprocessRunner,
)
from weave_slurm.slurm.sinfo import parse_nodes
from weave_slurm.slurm.templates import ALLOCATION_TEMPLATE, render_allocation

log = logging.getLogger(__name__)

_NEVER = ("requested node configuration is not available", "invalid partition",
          "invalid generic resource", "invalid gres", "invalid trackable resource")
_LATER = ("connection timed out", "unable to allocate resources", "job violates")
_GONE = ("invalid job id", "already completed", "does not exist")


def sbatch_argv(script: Path) -> list[str]:
    """``sbatch --parsable --no-requeue SCRIPT``; the rest is in the rendered script.
    ``--no-requeue`` on the command line (it wins over a site template's lines): with
    Slurm's default ``JobRequeue=1`` a batch job whose node fails is queued again under
    the same id, and weaved would wait on it as PENDING instead of replacing a lost
    allocation."""
    return ["sbatch", "--parsable", "--no-requeue", str(script)]


def srun_argv(alloc_id: str, spec: StepSpec) -> list[str]:
    """``srun --jobid --overlap --exact`` for a step (``-n``/``-c`` always given)."""
    argv = ["srun", f"--jobid={alloc_id}", "--overlap", "--exact",
            f"--job-name={spec.name}", "-n", str(spec.ntasks), "-c", str(spec.cpus_per_task)]
    if spec.node_count is not None:
        argv += ["-N", str(spec.node_count)]
    if spec.nodelist:
        argv.append(f"--nodelist={','.join(spec.nodelist)}")
    if spec.gpus_per_node:
        argv.append(f"--gres=gpu:{spec.gpus_per_node}")
    if spec.het_group is not None:
        argv.append(f"--het-group={spec.het_group}")
    return argv + list(spec.slurm_args) + list(spec.argv)


@dataclass
class _Launched:
    handle: StepHandle
    process: BackgroundProcess
    cancelled: bool = False


class SlurmCliBackend:
    """:class:`~weave_slurm.slurm.backend.Backend` over sbatch/srun/scancel/squeue/sinfo."""

    kind = "slurm"

    def __init__(self, runner: CommandRunner | None = None,
                 env: Mapping[str, str] | None = None, log_dir: Path | None = None,
                 timeout_s: float = 30.0, uid: int | None = None,
                 template: Path = ALLOCATION_TEMPLATE) -> None:
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.uid = os.getuid() if uid is None else uid   # whose allocations are listed
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.timeout_s = timeout_s
        self.template = template   # the allocation script (a site's, or the shipped one)
        self._steps: dict[tuple[str, str], _Launched] = {}

    def _run(self, argv: list[str], timeout_s: float | None = None) -> str:
        return self.runner.run(argv, timeout_s=timeout_s or self.timeout_s, env=self.env).stdout

    # -- allocations -------------------------------------------------------------------

    def allocate(self, request: AllocationRequest) -> Allocation:
        """Submit the rendered allocation script and wait up to ``request.immediate_s``
        for Slurm to start it (salloc's ``--immediate``): still pending then, it is
        cancelled and InsufficientResources says so (retry later); refused at submission
        as never satisfiable, InfeasibleRequest."""
        request.validate()
        script = render_allocation(request, template=self.template)
        try:
            alloc_id = self._submit(request, script)
        except SlurmCommandError as exc:
            raise _classify(exc, request) from exc
        deadline = time.monotonic() + request.immediate_s
        pause = 0.05
        while True:
            found = [a for a in self.list_allocations(request.job_name,
                                                      instance=request.instance)
                     if a.alloc_id == alloc_id]
            if found and found[0].state is AllocationState.RUNNING:
                log.info("allocated %s as job %s on %s", request.job_name, alloc_id,
                         ",".join(found[0].nodes))
                return found[0]
            if not found and pause > 0.5:   # listed by then if it was ever queued
                raise StateError(f"sbatch queued job {alloc_id} ({request.job_name}) but "
                                 "squeue does not list it: its batch script ended at once "
                                 "(Slurm could not start it; the node's slurmd log says "
                                 "why)")
            if time.monotonic() >= deadline:
                self.release(alloc_id)
                raise InsufficientResources(
                    f"sbatch {request.job_name}: job {alloc_id} still pending after "
                    f"{request.immediate_s} s; cancelled (retry later)")
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)

    def _submit(self, request: AllocationRequest, script: str) -> str:
        """``sbatch --parsable`` of ``script`` (kept as ``<log_dir>/allocations/<name>.sbatch``
        where there is a log dir: what was submitted last for that allocation); the id."""
        if self.log_dir is not None:
            path = self.log_dir / "allocations" / f"{request.job_name}.sbatch"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(script)
            out = self._run(sbatch_argv(path)).strip()
        else:
            with tempfile.NamedTemporaryFile("w", suffix=".sbatch") as tmp:
                tmp.write(script)
                tmp.flush()
                out = self._run(sbatch_argv(Path(tmp.name))).strip()
        alloc_id = out.split(";")[0]   # --parsable: "<id>[;<cluster>]"
        if not alloc_id.isdigit():
            raise StateError(f"sbatch for {request.job_name}: no job id in its output "
                             f"{out[-200:]!r}")
        return alloc_id

    def release(self, alloc_id: str) -> None:
        """scancel the allocation; releasing one that is already gone is not an error."""
        try:
            self._run(["scancel", alloc_id])
        except SlurmCommandError as exc:
            if not any(s in exc.stderr.lower() for s in _GONE):
                raise
        for key in [k for k in self._steps if k[0] == alloc_id]:
            self._steps[key].cancelled = True

    def shrink(self, alloc_id: str, keep: Sequence[str]) -> None:
        """``scontrol update JobId=<id> NodeList=<keep>``: Slurm ends the steps' tasks on
        the other nodes and the job goes on on ``keep`` (Slurm's FAQ, "Can I change my
        job's size after it has started running?"). Refused because it holds ``keep``
        only already (asked again after a restart): not an error."""
        if not keep:
            raise ConfigError(f"shrink of allocation {alloc_id}: keep at least one node")
        try:
            self._run(["scontrol", "update", f"JobId={alloc_id}",
                       f"NodeList={','.join(keep)}"])
        except SlurmCommandError:
            now = [a for a in self.list_allocations("") if a.alloc_id == alloc_id]
            if not now or not set(now[0].nodes) <= set(keep):
                raise

    def list_allocations(self, prefix: str = NAME_PREFIX, *,
                         instance: str | None = None) -> tuple[Allocation, ...]:
        """Active (pending, running, ending) allocations of this backend's uid whose name
        starts with ``prefix`` and, given ``instance``, whose comment carries that tag.
        ``--user`` asks squeue for ours only; each row's ``user_id`` is checked too (an
        answer that ignores the filter must not make another user's job ours)."""
        out = self._run(["squeue", "--json", f"--user={self.uid}"])
        self._reap()
        return tuple(a for a in squeue.parse_jobs(out, prefix, uid=self.uid, instance=instance)
                     if a.state is not AllocationState.ENDED)

    def _reap(self) -> None:
        """Collect every launched srun that has exited (each tick, with the world): a step
        whose allocation was released is never polled again, and its srun would stay a
        zombie of weaved. Its exit status stays known to :meth:`poll_step`."""
        for launched in self._steps.values():
            launched.process.poll()

    def nodes(self) -> tuple[NodeInfo, ...]:
        return parse_nodes(self._run(["sinfo", "--json"]))

    # -- steps -------------------------------------------------------------------------

    def launch_step(self, alloc_id: str, spec: StepSpec) -> StepHandle:
        spec.validate()
        log_path = spec.log_path or (self.log_dir / f"{alloc_id}-{spec.name}.log"
                                     if self.log_dir else None)
        proc = self.runner.spawn(srun_argv(alloc_id, spec), env={**self.env, **spec.env},
                                 log_path=log_path)
        handle = StepHandle(alloc_id, spec.name, proc.pid)
        self._steps[(alloc_id, spec.name)] = _Launched(handle, proc)
        return handle

    def open_step(self, alloc_id: str, spec: StepSpec) -> PipedProcess:
        spec.validate()
        if spec.ntasks != 1:
            raise ConfigError(f"step {spec.name!r}: a piped step has one task, got "
                              f"ntasks={spec.ntasks}")
        return self.runner.spawn_piped(srun_argv(alloc_id, spec), env={**self.env, **spec.env},
                                       log_path=spec.log_path)

    def list_steps(self, alloc_id: str) -> tuple[StepInfo, ...]:
        out = self._run(["squeue", "--steps", "-h", "-o", squeue.STEP_FORMAT])
        return tuple(s for s in squeue.parse_steps(out) if s.alloc_id == alloc_id)

    def poll_step(self, handle: StepHandle) -> StepStatus:
        launched = self._steps.get((handle.alloc_id, handle.name))
        if launched is None:  # launched by an earlier process: ask Slurm
            running = any(s.name == handle.name for s in self.list_steps(handle.alloc_id))
            return StepStatus(StepState.RUNNING if running else StepState.UNKNOWN)
        rc = launched.process.poll()
        if rc is None:
            return StepStatus(StepState.RUNNING)
        if rc != 0 and not launched.cancelled:  # released by someone else (e.g. after restart)?
            launched.cancelled = all(a.alloc_id != handle.alloc_id
                                     for a in self.list_allocations(""))
        if launched.cancelled:
            return StepStatus(StepState.CANCELLED, rc)
        return StepStatus(StepState.COMPLETED if rc == 0 else StepState.FAILED, rc)

    def cancel_step(self, handle: StepHandle, timeout_s: float = 10.0) -> None:
        """scancel ``<job>.<step>`` for every step of that name, then reap the srun."""
        launched = self._steps.get((handle.alloc_id, handle.name))
        if launched is not None:
            launched.cancelled = True
        for step in self.list_steps(handle.alloc_id):
            if step.name == handle.name:
                try:
                    self._run(["scancel", step.step_id])
                except SlurmCommandError as exc:
                    if not any(s in exc.stderr.lower() for s in _GONE):
                        raise
        if launched is None:
            return
        deadline = time.monotonic() + timeout_s
        while launched.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if launched.process.poll() is None:  # not registered yet, or srun hangs
            log.warning("step %s/%s: srun pid %d still running; killing it", handle.alloc_id,
                        handle.name, handle.launcher_pid)
            launched.process.send_signal(signal.SIGKILL)
            launched.process.wait(timeout=5)


def _classify(exc: SlurmCommandError, request: AllocationRequest) -> Exception:
    """Map a failed sbatch to the caller's next move (never / later / look at it)."""
    text = (exc.stderr + exc.stdout).lower()
    last = ((exc.stderr + exc.stdout).strip().splitlines() or [""])[-1]
    if any(s in text for s in _NEVER):
        return InfeasibleRequest(f"sbatch {request.job_name}: Slurm refuses the request as "
                                 f"asked: {last}")
    if exc.timed_out or any(s in text for s in _LATER):
        return InsufficientResources(f"sbatch {request.job_name}: not accepted now "
                                     f"(retry later): {last}")
    return exc
