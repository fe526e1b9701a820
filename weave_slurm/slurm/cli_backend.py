"""The Slurm backend over the command-line tools (the default door to a real Slurm).

``salloc --no-shell`` holds allocations, ``srun --jobid=<id> --overlap --exact``
runs steps in the background, ``scancel`` ends both, ``squeue --json`` /
``squeue --steps`` / ``sinfo --json`` read the world. Every command goes through
the injected :class:`~weave_slurm.slurm.command_runner.CommandRunner`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Mapping
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
    ResourceSpec,
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

log = logging.getLogger(__name__)

_GRANTED_RE = re.compile(r"Granted job allocation (\d+)")
_NEVER = ("requested node configuration is not available", "invalid partition",
          "invalid generic resource", "invalid gres", "invalid trackable resource")
_LATER = ("connection timed out", "unable to allocate resources", "job violates")
_GONE = ("invalid job id", "already completed", "does not exist")


def component_args(spec: ResourceSpec) -> list[str]:
    """The salloc/sbatch options (``--flag=value``) for one homogeneous component."""
    args = [f"--partition={spec.partition}", f"--nodes={spec.node_count}",
            "--ntasks-per-node=1", f"--cpus-per-task={spec.cpus_per_node}"]
    if spec.gpus_per_node:
        kind = f"{spec.gpu_type}:" if spec.gpu_type else ""
        args.append(f"--gres=gpu:{kind}{spec.gpus_per_node}")
    return args


def salloc_argv(request: AllocationRequest) -> list[str]:
    """``salloc --no-shell`` for a request; components are joined with ``:`` (hetjob)."""
    argv = ["salloc", "--no-shell", f"--job-name={request.job_name}",
            f"--comment={request.comment}", f"--immediate={request.immediate_s}"]
    if request.time_limit_min is not None:
        argv.append(f"--time={request.time_limit_min}")
    if request.account is not None:
        argv.append(f"--account={request.account}")
    if request.qos is not None:
        argv.append(f"--qos={request.qos}")
    for i, comp in enumerate(request.components):
        if i:
            argv.append(":")
        argv += component_args(comp)
    return argv


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
    """:class:`~weave_slurm.slurm.backend.Backend` over salloc/srun/scancel/squeue/sinfo."""

    kind = "slurm"

    def __init__(self, runner: CommandRunner | None = None,
                 env: Mapping[str, str] | None = None, log_dir: Path | None = None,
                 timeout_s: float = 30.0, uid: int | None = None) -> None:
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.uid = os.getuid() if uid is None else uid   # whose allocations are listed
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.timeout_s = timeout_s
        self._steps: dict[tuple[str, str], _Launched] = {}

    def _run(self, argv: list[str], timeout_s: float | None = None) -> str:
        return self.runner.run(argv, timeout_s=timeout_s or self.timeout_s, env=self.env).stdout

    # -- allocations -------------------------------------------------------------------

    def allocate(self, request: AllocationRequest) -> Allocation:
        request.validate()
        argv = salloc_argv(request)
        try:
            res = self.runner.run(argv, timeout_s=request.immediate_s + self.timeout_s,
                                  env=self.env)
        except SlurmCommandError as exc:
            raise _classify(exc, request) from exc
        m = _GRANTED_RE.search(res.stderr + res.stdout)
        if not m:
            raise StateError(f"salloc for {request.job_name}: no 'Granted job allocation' in "
                             f"its output: {(res.stderr + res.stdout).strip()[-200:]!r}")
        alloc_id = m.group(1)
        for _ in range(20):
            found = [a for a in self.list_allocations(request.job_name,
                                                      instance=request.instance)
                     if a.alloc_id == alloc_id]
            if found:
                log.info("allocated %s as job %s on %s", request.job_name, alloc_id,
                         ",".join(found[0].nodes))
                return found[0]
            time.sleep(0.05)
        raise StateError(f"salloc granted job {alloc_id} ({request.job_name}) but squeue does "
                         "not list it")

    def release(self, alloc_id: str) -> None:
        """scancel the allocation; releasing one that is already gone is not an error."""
        try:
            self._run(["scancel", alloc_id])
        except SlurmCommandError as exc:
            if not any(s in exc.stderr.lower() for s in _GONE):
                raise
        for key in [k for k in self._steps if k[0] == alloc_id]:
            self._steps[key].cancelled = True

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
    """Map a failed salloc to the caller's next move (never / later / look at it)."""
    text = (exc.stderr + exc.stdout).lower()
    last = ((exc.stderr + exc.stdout).strip().splitlines() or [""])[-1]
    if any(s in text for s in _NEVER):
        return InfeasibleRequest(f"salloc {request.job_name}: Slurm refuses the request as "
                                 f"asked: {last}")
    if exc.timed_out or any(s in text for s in _LATER):
        return InsufficientResources(f"salloc {request.job_name}: not granted within "
                                     f"{request.immediate_s} s (retry later): {last}")
    return exc
