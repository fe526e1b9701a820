"""The node daemon's side of cooperative jobs: the phase gate and the job's own processes.

A cooperative job (``[launch]`` in its spec, docs/job_api.md) is not run by a resident
worker: its own processes run, one per role, started here by ``launch`` as the job's
uid (weaved asks; the processes inherit this daemon's Slurm step), and they talk to
this daemon through its node-local socket (``WEAVE_NODE_SOCKET``) with
:mod:`weave_slurm.gate`. SO_PEERCRED says who asks: only the job's owner (or root) may
wait at or finish a job's gate (:meth:`NodeDaemon.job`).

The gate reuses the phase protocol: the process **waits** for a phase (``gate`` action
``wait``: phase and the weight version it consumes); weaved sees it in ``phase``
(``gate.waiting``) and either refuses it (action ``refuse``, a :class:`GateRefused` with
the reason raised in the process) or **grants** it with an ``activate`` whose worker is
the external process (``external: true``). The grant is an activation like a resident
worker's: ``phase`` reports it ``running`` until the process leaves its ``with`` block
(action ``done``: the version it produced, its metrics), then ``exited`` with that as its
``result``. ``deactivate`` revokes a grant (its ``done`` is refused with
:class:`PhaseRevoked`); ``drop`` stops the job's processes.

A ``wait`` blocks at most ``timeout_s`` (the SDK asks again), so a process that died
stops counting as waiting ``WAITER_GRACE_S`` after its last wait ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from weave_slurm.config.oci import oci_conf_path, read_oci_conf
from weave_slurm.config.sbatch import host_path
from weave_slurm.errors import ConfigError, GateRefused, PhaseRevoked, StateError, WeaveError
from weave_slurm.node import containers, reaper
from weave_slurm.node.index import JobRef
from weave_slurm.node.job_env import job_environment
from weave_slurm.node.open_as import open_as
from weave_slurm.node.protocol import Request, WorkerState
from weave_slurm.node.segments import gid_of
from weave_slurm.node.worker import WorkerKind
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)

#: Longest single ``wait`` (the SDK asks again); a waiter counts this long after it ended.
MAX_WAIT_S = 30.0
WAITER_GRACE_S = 2.0
#: A stopped process gets SIGTERM, then SIGKILL after this.
STOP_GRACE_S = 3.0
_ROLES = ("rollout", "train")
#: The launcher each role's line runs under (a stdlib-only script: python -I -S)
REAPER = reaper.__file__
#: stdout/stderr redirected by a shell running as the job's uid, so the files are its own


@dataclass
class _Waiter:
    phase: Phase
    version: int
    expires_s: float
    blocked: int = 0                         # threads blocked in its wait now
    error: WeaveError | None = None          # a refusal not yet delivered


@dataclass
class _Grant:
    """One granted phase: an activation whose worker is the job's own process."""

    seq: int
    phase: Phase
    version: int
    step: int
    started_s: float
    claimed: bool = False
    state: WorkerState = WorkerState.RUNNING
    returncode: int | None = None
    result: object = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase.value, "state": self.state.value, "pid": None,
                "returncode": self.returncode, "started_s": self.started_s,
                "external": True, "activation": self.seq, "version": self.version,
                "claimed": self.claimed, "result": self.result, "error": self.error}


@dataclass
class _Proc:
    role: str
    popen: subprocess.Popen[bytes]
    returncode: int | None = None


@dataclass
class _Slot:
    waiters: dict[Phase, _Waiter] = field(default_factory=dict)
    grant: _Grant | None = None
    seq: int = 0
    procs: dict[str, _Proc] = field(default_factory=dict)


class _Config(Protocol):
    @property
    def socket(self) -> Path: ...

    @property
    def node_name(self) -> str: ...


class _Store(Protocol):
    def job_dir(self, job: JobRef) -> Path: ...


class Daemon(Protocol):
    """What the gate needs of its node daemon."""

    lock: threading.RLock

    @property
    def config(self) -> _Config: ...

    @property
    def store(self) -> _Store: ...

    def job(self, uid: int, request: Request, what: str = "") -> JobRef: ...


class GateOps:
    """The ``gate`` and ``launch`` handlers and the external activations of a daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._cond = threading.Condition()
        self._slots: dict[str, _Slot] = {}
        self._launches: dict[tuple[str, str], containers.Launch] = {}   # (job, role)

    def _slot(self, job: JobRef) -> _Slot:
        return self._slots.setdefault(job.job_id, _Slot())

    # -- the job's side (the gate SDK) -----------------------------------------------
    def gate(self, uid: int, request: Request) -> dict[str, Any]:
        action = request.args.get("action")
        handlers = {"wait": self._wait, "done": self._done, "refuse": self._refuse}
        if action not in handlers:
            raise ConfigError(f"gate: action {action!r}; valid: {', '.join(handlers)}")
        return handlers[str(action)](uid, request)

    def _wait(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.daemon.job(uid, request)
        phase, version = _phase(request), _int(request, "version")
        timeout = min(float(request.args.get("timeout_s") or MAX_WAIT_S), MAX_WAIT_S)
        end = time.monotonic() + timeout
        with self._cond:
            slot = self._slot(job)
            waiter = slot.waiters.get(phase)
            if waiter is None or waiter.version != version:
                waiter = slot.waiters[phase] = _Waiter(phase, version, end + WAITER_GRACE_S)
                self._cond.notify_all()
            waiter.blocked += 1
            try:
                while True:
                    if waiter.error is not None:
                        error, waiter.error = waiter.error, None
                        slot.waiters.pop(phase, None)
                        raise error
                    grant = slot.grant
                    if grant is not None and not grant.claimed and grant.phase is phase \
                            and grant.state is WorkerState.RUNNING:
                        return self._claim(slot, grant, waiter)
                    left = end - time.monotonic()
                    if left <= 0 or self._slots.get(job.job_id) is not slot:
                        waiter.expires_s = time.monotonic() + WAITER_GRACE_S
                        return {"granted": False}
                    self._cond.wait(left)
            finally:
                waiter.blocked -= 1

    def _claim(self, slot: _Slot, grant: _Grant, waiter: _Waiter) -> dict[str, Any]:
        slot.waiters.pop(grant.phase, None)
        if grant.version != waiter.version:   # the runtime granted what it saw asked
            grant.state, grant.returncode = WorkerState.FAILED, 1
            grant.error = (f"granted {grant.phase.value} at version {grant.version}, but "
                           f"the process asked for version {waiter.version}")
            raise GateRefused(grant.error)
        grant.claimed = True
        self._cond.notify_all()
        return {"granted": True, "activation": grant.seq, "phase": grant.phase.value,
                "version": grant.version, "step": grant.step}

    def _done(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.daemon.job(uid, request)
        seq = _int(request, "activation")
        metrics = request.args.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise ConfigError("gate done: 'metrics' must be an object of numbers")
        with self._cond:
            grant = self._slot(job).grant
            if grant is None or grant.seq != seq:
                raise PhaseRevoked(f"job {job.job_id!r}: activation {seq} is not the "
                                   "current grant on this node")
            if grant.state is not WorkerState.RUNNING:
                raise PhaseRevoked(f"job {job.job_id!r}: {grant.phase.value} at version "
                                   f"{grant.version} was revoked: {grant.error}")
            error = request.args.get("error")
            if error is not None:   # its with block raised: the phase failed
                grant.state, grant.returncode = WorkerState.FAILED, 1
                grant.error = str(error)[:500]
                self._cond.notify_all()
                return grant.to_json()
            produced = request.args.get("produced")
            grant.result = {"version": grant.version + 1 if grant.phase is Phase.TRAIN
                            else grant.version, "consumed": grant.version,
                            "produced": produced, "metrics": metrics, "external": True}
            grant.state, grant.returncode = WorkerState.EXITED, 0
            self._cond.notify_all()
            return grant.to_json()

    def _refuse(self, uid: int, request: Request) -> dict[str, Any]:
        self._trusted(uid, "gate refuse")
        job = self.daemon.job(uid, request)
        phase, version = _phase(request), _int(request, "version")
        message = str(request.args.get("message") or "refused")
        with self._cond:
            slot = self._slot(job)
            waiter = slot.waiters.get(phase)
            if waiter is None or waiter.version != version or _pending(slot, phase):
                return {"refused": False}    # gone, another version, or being granted
            waiter.error = GateRefused(message)
            self._cond.notify_all()
        return {"refused": True}

    # -- weaved's side: grant (activate), poll (phase), revoke (deactivate) ----------
    def activate(self, uid: int, request: Request,
                 kinds: dict[str, WorkerKind]) -> dict[str, Any]:
        """A grant; ``kinds`` (the daemon's job -> how its last phase ran) learns it."""
        job = self.daemon.job(uid, request)
        phase, version = _phase(request), _int(request, "version")
        with self._cond:
            slot = self._slot(job)
            if slot.grant is not None and slot.grant.state is WorkerState.RUNNING:
                raise StateError(f"job {job.job_id!r} already holds phase "
                                 f"{slot.grant.phase.value!r}; deactivate first")
            slot.seq += 1
            slot.grant = _Grant(slot.seq, phase, version, int(request.args.get("step") or 0),
                                time.time())
            self._cond.notify_all()
            with self.daemon.lock:
                kinds[job.job_id] = WorkerKind.EXTERNAL
            return {"job": job.job_id, **slot.grant.to_json()}

    def last(self, job: JobRef) -> dict[str, Any] | None:
        with self._cond:
            slot = self._slots.get(job.job_id)
            grant = None if slot is None else slot.grant
            return None if grant is None else {"job": job.job_id, **grant.to_json()}

    def cancel(self, job: JobRef) -> dict[str, Any]:
        with self._cond:
            slot = self._slots.get(job.job_id)
            grant = None if slot is None else slot.grant
            if grant is not None and grant.state is WorkerState.RUNNING:
                grant.state, grant.error = WorkerState.KILLED, "revoked by weave"
                self._cond.notify_all()
        return self.last(job) or {}

    def info(self, job: JobRef) -> dict[str, Any]:
        """What the job's processes do on this node: who waits for what, who exited."""
        now = time.monotonic()
        with self._cond:
            slot = self._slots.get(job.job_id)
            if slot is None:
                return {"waiting": {}, "procs": {}}
            waiting = {p.value: w.version for p, w in slot.waiters.items()
                       if w.error is None and (w.blocked or w.expires_s > now)
                       and not _pending(slot, p)}    # a granted one is not waiting
            procs = {r: {"pid": p.popen.pid, "returncode": p.returncode}
                     for r, p in slot.procs.items()}
            return {"waiting": waiting, "procs": procs}

    # -- the job's processes -----------------------------------------------------------
    def launch(self, uid: int, request: Request) -> dict[str, Any]:
        """Start (action ``start``) or stop (``stop``) a role's process of the job."""
        self._trusted(uid, "launch")
        job = self.daemon.job(uid, request)
        if request.args.get("action") == "stop":
            self.stop(job)
            return {"job": job.job_id, "stopped": True}
        role = request.args.get("role")
        command, env = request.args.get("command"), request.args.get("env") or {}
        if role not in _ROLES or not isinstance(command, str) or not isinstance(env, dict):
            raise ConfigError(f"launch of {job.job_id}: 'role' must be one of "
                              f"{', '.join(_ROLES)}, 'command' a string, 'env' an object")
        with self._cond:
            old = self._slot(job).procs.get(role)
            if old is not None and old.returncode is None:
                raise StateError(f"job {job.job_id!r}: its {role} process runs already "
                                 f"(pid {old.popen.pid})")
        try:
            popen = self._spawn(job, role, command, {str(k): str(v) for k, v in env.items()},
                                request.args)
        except WeaveError:
            with self._cond:   # a container prepared for it never ran: its bundle goes
                unused = self._launches.pop((job.job_id, role), None)
            if unused is not None:
                shutil.rmtree(unused.bundle_dir, ignore_errors=True)
            raise
        proc = _Proc(role, popen)
        with self._cond:
            self._slot(job).procs[role] = proc
        threading.Thread(target=self._reap, args=(proc, job.job_id), name=f"launch-{job.job_id}",
                         daemon=True).start()
        log.info("job %s: %s process started as uid %d (pid %d)", job.job_id, role, job.uid,
                 popen.pid)
        return {"job": job.job_id, "role": role, "pid": popen.pid}

    def _spawn(self, job: JobRef, role: str, command: str, env: dict[str, str],
               args: dict[str, Any]) -> subprocess.Popen[bytes]:
        try:
            user = pwd.getpwuid(job.uid)
        except KeyError:
            raise ConfigError(f"launch of {job.job_id}: uid {job.uid} has no passwd "
                              "entry on this node") from None
        workdir = args.get("workdir") or user.pw_dir
        output, error = (host_path(v, self.daemon.config.node_name)   # %N: this node
                         if isinstance(v, str) else v
                         for v in (args.get("output"), args.get("error")))
        for key, value in (("workdir", workdir), ("output", output), ("error", error)):
            if value is not None and not (isinstance(value, str) and os.path.isabs(value)):
                raise ConfigError(f"launch of {job.job_id}: {key!r} must be an absolute "
                                  f"path, got {value!r}")
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir,
                "USER": user.pw_name, "LOGNAME": user.pw_name}
        gpus = args.get("gpus")   # the member's GPUs on this node (CUDA_VISIBLE_DEVICES)
        env = {**base, **env, **job_environment(
                   node=self.daemon.config.node_name, job_name=env.get("WEAVE_JOB_NAME"),
                   gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool)
                   and gpus >= 0 else None),
               "WEAVE_NODE_SOCKET": str(self.daemon.config.socket),
               "WEAVE_JOB_ID": job.job_id, "WEAVE_ROLE": role,
               "WEAVE_NODE": self.daemon.config.node_name}
        # the job's own launcher line meets a shell (the user's, as the user: as sbatch
        # runs a script's body); weave's own commands stay plain argv. It runs under a
        # child subreaper (node/reaper.py), so what it daemonizes is stopped with it
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        line = [shell, "-c", command]
        argv = [sys.executable, "-I", "-S", REAPER, *reaper.command_line(line)]
        gid, groups = os.getgid(), list(os.getgroups())
        container = args.get("container")
        if os.geteuid() == 0 and job.uid != 0:   # the launcher takes the job's ids itself
            gid = gid_of(job.uid)
            groups = os.getgrouplist(user.pw_name, gid)
            argv = [sys.executable, "-I", "-S", REAPER,
                    *reaper.command_line(line, job.uid, gid, groups)]
        elif os.geteuid() != job.uid:
            raise StateError(f"launch of {job.job_id}: this node daemon runs as uid "
                             f"{os.geteuid()}, it cannot start processes of uid {job.uid}")
        if container is not None:   # the runtime runs as root; the process as the job's uid
            launch = self._contained(job, role, str(container), command, env, workdir,
                                     user.pw_name, gid, groups)
            argv = [sys.executable, "-I", "-S", REAPER, *reaper.command_line(launch.argv)]
        # the output files are opened as the job's uid with its groups (never as root):
        # one it cannot create refuses the launch, naming the file
        fds: list[int] = []
        try:
            for path in (output or os.devnull, error):
                if path is not None:
                    fds.append(open_as(job.uid, str(path), gid, groups))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            raise ConfigError(f"launch of {job.job_id}: cannot open its {role} output file "
                              f"{exc.filename!r} as uid {job.uid}: {exc.strerror}") from None
        out_fd, err_fd = fds[0], fds[-1]
        try:
            return subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out_fd, stderr=err_fd, start_new_session=True,
                                    close_fds=True)
        except OSError as exc:
            raise ConfigError(f"launch of {job.job_id}: cannot start its {role} process "
                              f"in {workdir}: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)

    def _contained(self, job: JobRef, role: str, bundle: str, command: str,
                   env: dict[str, str], workdir: str, user: str, gid: int,
                   groups: list[int]) -> containers.Launch:
        """The role's launch inside ``bundle`` (node/containers.py), kept for its delete."""
        if os.geteuid() != 0:
            raise StateError(f"launch of {job.job_id}: its container needs a node daemon "
                             f"running as root (the OCI runtime runs as root, as slurmstepd "
                             f"runs it); this one runs as uid {os.geteuid()}")
        conf = read_oci_conf()
        if conf is None:
            raise ConfigError(f"launch of {job.job_id}: container {bundle!r}: this node has "
                              f"no OCI runtime configured ({oci_conf_path()} does not exist)")
        names = {"n": self.daemon.config.node_name or os.uname().nodename, "u": user,
                 "j": os.environ.get("SLURM_JOB_ID", "0"), "s": f"weave{job.job_id}",
                 "t": role}
        launch = containers.prepare(
            conf, bundle, self.daemon.store.job_dir(job) / f"oci-{role}",
            args=containers.shell_args(bundle, command), env=env, workdir=workdir,
            uid=job.uid, gid=gid, groups=groups,
            socket_dir=str(self.daemon.config.socket.parent), names=names)
        with self._cond:
            self._launches[(job.job_id, role)] = launch
        return launch

    def _reap(self, proc: _Proc, job_id: str) -> None:
        rc = proc.popen.wait()
        with self._cond:
            launch = self._launches.pop((job_id, proc.role), None)
        if launch is not None:
            containers.remove(launch)
        with self._cond:
            proc.returncode = rc
            self._cond.notify_all()

    def stop(self, job: JobRef) -> None:
        """SIGTERM the job's processes (their sessions), SIGKILL after a grace.

        Each launcher (node/reaper.py) stops its role's whole tree, daemonized
        descendants included, within its own grace (shorter than ours)."""
        with self._cond:
            slot = self._slots.get(job.job_id)
            procs = [] if slot is None else [p for p in slot.procs.values()
                                             if p.returncode is None]
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        if procs:
            timer = threading.Timer(STOP_GRACE_S, _kill_all, (procs,))
            timer.daemon = True
            timer.start()

    def drop(self, job: JobRef) -> None:
        self.cancel(job)
        self.stop(job)
        with self._cond:
            self._slots.pop(job.job_id, None)
            self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            jobs = [JobRef(j, 0) for j in self._slots]
        for job in jobs:
            self.stop(job)

    def _trusted(self, uid: int, what: str) -> None:
        if uid not in (0, os.geteuid()):
            raise StateError(f"{what}: only weaved (root or this daemon's uid) may ask; "
                             f"uid {uid} may not")


def _pending(slot: _Slot, phase: Phase) -> bool:
    """A grant of ``phase`` its process has not picked up yet."""
    grant = slot.grant
    return grant is not None and grant.phase is phase and not grant.claimed \
        and grant.state is WorkerState.RUNNING


def _kill_all(procs: list[_Proc]) -> None:
    for proc in procs:
        _signal(proc, signal.SIGKILL)


def _signal(proc: _Proc, sig: signal.Signals) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, sig)


def _phase(request: Request) -> Phase:
    phase = Phase.parse(request.args.get("phase"))
    if phase is Phase.SYNC:
        raise ConfigError("gate: phase 'sync'; valid: rollout, train")
    return phase


def _int(request: Request, key: str) -> int:
    value = request.args.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"gate {request.op.value}: {key!r} must be an integer >= 0, "
                          f"got {value!r}")
    return value
