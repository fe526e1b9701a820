"""The daemon side of resident workers: zygotes and one pre-forked worker per job.

``ResidentPool.start`` launches the zygote (``zygote``), which imports torch once.
``ensure(job)`` asks it to fork the job's resident worker ahead of time (at register),
so ``activate`` only sends that already-running process the job's own segment paths
and an entry to call: no process start, no ``import torch``, an attach of < 1 ms.
A worker that dies (crash, ``kill -9``, an entry calling ``sys.exit``) is reported by
the zygote; its running activation is marked ``killed``/``failed`` and a replacement
is forked at once, so the next activation works. The daemon's state (segments,
budget, registry) never lives in a worker.

A job that names its own ``python`` (activate's ``python``) gets its worker from a
zygote of that interpreter, run as the job's uid (``zygotes``), started on demand and
reused by that user's jobs naming it, stopped when no job needs it. Its first
activation replaces the worker forked at register and waits for that zygote; one
that cannot start (no torch there, say) fails the activation with its last words.

Worker states: ``starting -> idle <-> busy``; any of them ``-> dead`` (then replaced
unless the job was dropped or the pool is shutting down).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError, InsufficientResources, NodeUnavailable, StateError
from weave_slurm.node.index import JobRef
from weave_slurm.node.pool_records import Activation, ResidentState, Slot, Worker
from weave_slurm.node.protocol import WorkerState
from weave_slurm.node.segments import gid_of
from weave_slurm.node.seqpacket import receive, send
from weave_slurm.node.zygotes import Interpreter, ZygoteProcess, interpreter_of
from weave_slurm.vocab import Phase

log = logging.getLogger(__name__)

LOG_NAME = "resident.log"


class ResidentPool:
    """The zygote and the resident workers of every registered job of one daemon."""

    #: a zygote that dies unexpectedly is started again, at most this many times per
    #: ``RESTART_WINDOW_S`` (then the pool gives up: every activation is refused)
    MAX_RESTARTS = 3
    RESTART_WINDOW_S = 60.0
    #: a worker's last reply can still be in its socket when the zygote reports its
    #: exit; the socket's end of stream (after that reply) ends it, or this grace does
    #: (a child of the worker may hold the socket open)
    EXIT_GRACE_S = 1.0
    #: a zygote that died is started again this long after (:meth:`_restart`)
    RESTART_GRACE_S = 1.0

    def __init__(self, root: Path, start_timeout_s: float = 120.0) -> None:
        self.root = root
        self.start_timeout_s = start_timeout_s
        self.broken: str | None = None   # why the pool gave up (None: it works)
        self._cond = threading.Condition()
        self._slots: dict[str, Slot] = {}
        self._zygotes: dict[Interpreter, ZygoteProcess] = {}
        self._closing = False
        self._seq = 0

    # -- zygotes -------------------------------------------------------------------
    def start(self) -> None:
        """Launch the zygote (it imports torch in the background; does not wait)."""
        with self._cond:
            self._spawn(Interpreter())

    def zygote_pids(self) -> dict[Interpreter, int | None]:
        """The running zygotes' pids, by interpreter."""
        with self._cond:
            return {key: z.pid for key, z in self._zygotes.items()}

    def _spawn(self, key: Interpreter) -> ZygoteProcess | None:
        """Start the zygote of ``key`` (caller holds the condition). One of a job's own
        interpreter that cannot be started fails its slots instead (None)."""
        z = ZygoteProcess(key, self.root, self._on_message, self._zygote_gone)
        try:
            z.start()
        except (OSError, subprocess.SubprocessError) as exc:
            if not key.own:
                raise
            self._fail(key, f"cannot start {key.words()}: {exc}")
            return None
        self._zygotes[key] = z
        return z

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the zygote has imported torch and every wanted worker is idle."""
        def ready() -> bool:
            default = self._zygotes.get(Interpreter())
            return default is not None and default.ready and all(
                s.error is not None or (s.worker is not None
                                        and s.worker.state == ResidentState.IDLE)
                for s in self._slots.values() if s.wanted)
        with self._cond:
            ok = self._cond.wait_for(lambda: self._closing or ready(),
                                     timeout=timeout_s or self.start_timeout_s)
        if not ok:
            raise StateError("resident pool: zygote or workers not ready after "
                             f"{timeout_s or self.start_timeout_s} s")

    def stopping(self) -> None:
        """The daemon is stopping (a signal; :meth:`shutdown` follows): from now on no
        zygote or worker that dies is started again, and no activation is taken."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Stop every worker and every zygote (state in shm is untouched)."""
        with self._cond:
            self._closing = True
            workers = [s.worker for s in self._slots.values() if s.worker is not None]
            zygotes = list(self._zygotes.values())
            self._cond.notify_all()
        for worker in workers:
            self._kill(worker)
        for z in zygotes:
            z.stop()
        for z in zygotes:
            z.wait(10)
            z.close()

    def _on_message(self, z: ZygoteProcess, msg: dict[str, Any]) -> None:
        with self._cond:
            if self._zygotes.get(z.key) is z:
                self._on_zygote(z, msg)
            self._cond.notify_all()

    def _zygote_gone(self, z: ZygoteProcess) -> None:
        """A zygote's end of stream: expected at shutdown or when retired; otherwise
        start a new one (its workers died with it; each is forked again when the new
        one is ready). One of a job's interpreter that never became ready is not
        started again: its jobs' activations fail, saying why."""
        with self._cond:
            z.ready = False
            if self._closing or self._zygotes.get(z.key) is not z:   # stopped, retired
                z.close()
                self._cond.notify_all()
                return
            rc = z.exit_status() if z.key.own and not z.was_ready else z.poll()
            now = time.monotonic()
            z.restarts = [t for t in z.restarts if now - t < self.RESTART_WINDOW_S]
            why = None
            if z.key.own and not z.was_ready:
                why = f"{z.key.words()} exited (status {rc}) before it was ready" \
                      f"{z.last_words()}"
            elif len(z.restarts) >= self.MAX_RESTARTS:
                why = (f"the zygote of {z.key.words()} died {len(z.restarts) + 1} times "
                       f"in {self.RESTART_WINDOW_S:.0f} s (last exit status {rc})")
            if why is not None:
                self._give_up(z, why)
                return
            z.restarts.append(now)
            z.close()
            z.wait(5)
            timer = threading.Timer(self.RESTART_GRACE_S, self._restart, (z, rc))
            timer.daemon = True
            timer.start()

    def _restart(self, z: ZygoteProcess, rc: int | None) -> None:
        """A dead zygote's successor, after ``RESTART_GRACE_S``: none if the daemon is
        stopping by then (Slurm signals every process of a step that ends, the zygote
        too, and a new one would import torch again only to be killed)."""
        with self._cond:
            if self._closing or self._zygotes.get(z.key) is not z:
                return
            log.error("resident pool: the zygote of %s exited (status %s); starting a new "
                      "one", z.key.words(), rc)
            new = self._spawn(z.key)
            if new is not None:
                new.restarts = z.restarts
            self._cond.notify_all()

    def _give_up(self, z: ZygoteProcess, why: str) -> None:
        """The node daemon's zygote: the pool gives up (every activation is refused);
        a job interpreter's: only its jobs' activations fail (caller holds the
        condition)."""
        log.error("resident pool: %s; no new workers from it", why)
        z.close()
        if z.key.own:
            self._fail(z.key, why)
        else:
            self.broken = why
            self._closing = True
        self._cond.notify_all()

    def _fail(self, key: Interpreter, why: str) -> None:
        """Forget ``key``'s zygote; its slots' activations fail with ``why``."""
        self._zygotes.pop(key, None)
        for slot in self._slots.values():
            if slot.key == key:
                slot.error = why
        self._cond.notify_all()

    def _on_zygote(self, z: ZygoteProcess, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        if event == "ready":
            z.ready = z.was_ready = True
            for slot in self._slots.values():
                if slot.wanted and slot.worker is None and slot.key == z.key:
                    self._fork(slot)
        elif event == "exit":     # only of a worker this zygote forked
            pid, rc = msg.get("pid"), int(msg.get("returncode", -1))
            for slot in list(self._slots.values()):
                w = slot.worker
                if w is not None and w.pid == pid and w.zygote is z \
                        and w.state is not ResidentState.DEAD:
                    w.exit_rc = rc
                    timer = threading.Timer(self.EXIT_GRACE_S, self._exit_grace, (slot, w))
                    timer.daemon = True
                    timer.start()
                    continue
                act = slot.last
                if act is not None and act.pid == pid and act.returncode is None \
                        and slot.key == z.key:
                    act.returncode = rc     # the socket's end of stream came first
                    if rc >= 0:
                        act.state = WorkerState.EXITED if rc == 0 else WorkerState.FAILED
        elif event == "fork_failed":
            log.error("resident pool: fork %s failed: %s", msg.get("seq"), msg.get("message"))

    def _retire_unused(self) -> None:
        """Stop job-interpreter zygotes no wanted slot needs (caller holds the
        condition): each holds a torch-imported interpreter in memory."""
        used = {s.key for s in self._slots.values() if s.wanted}
        for key in [k for k in self._zygotes if k.own and k not in used]:
            self._zygotes.pop(key).stop()

    def _exit_grace(self, slot: Slot, worker: Worker) -> None:
        with self._cond:
            if worker.state is not ResidentState.DEAD:
                self._died(slot, worker, worker.exit_rc)
                self._cond.notify_all()

    # -- workers -------------------------------------------------------------------
    def ensure(self, job: JobRef, log_dir: Path) -> None:
        """Make sure ``job`` has a resident worker (forked now or when the zygote is up)."""
        with self._cond:
            slot = self._slots.setdefault(job.job_id, Slot(job, log_dir))
            slot.wanted = True
            self._want_worker(slot)

    def _want_worker(self, slot: Slot) -> None:
        """Fork ``slot``'s worker now if its zygote is ready; else once it is (its
        zygote started if none runs). Caller holds the condition."""
        if slot.worker is not None or self._closing:
            return
        z = self._zygotes.get(slot.key)
        if z is None and slot.key.own and slot.error is None:
            z = self._spawn(slot.key)
        if z is not None and z.ready:
            self._fork(slot)

    def _switch(self, slot: Slot, key: Interpreter) -> None:
        """``slot``'s job now runs with ``key``'s interpreter: its idle worker (of the
        other interpreter) goes; a zygote no job needs any more is stopped."""
        old, slot.worker, slot.key, slot.error = slot.worker, None, key, None
        if old is not None:
            self._kill(old)     # its reader sees the end; slot.worker is not it: no refork
        self._retire_unused()

    def _fork(self, slot: Slot) -> None:
        """Ask the slot's zygote for a worker of ``slot.job`` (caller holds the
        condition and saw that zygote ready)."""
        z = self._zygotes.get(slot.key)
        if z is None:
            raise StateError(f"resident pool: no zygote of {slot.key.words()} runs")
        job = slot.job
        log_path = slot.log_dir / LOG_NAME
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if os.geteuid() == 0 and job.uid != 0:
                os.fchown(fd, job.uid, gid_of(job.uid))
            self._seq += 1
            worker = Worker(job, ours, log_path, self._seq, z)
            z.send({"op": "fork", "seq": self._seq, "job": job.job_id, "uid": job.uid,
                    "gid": gid_of(job.uid), "cwd": str(log_path.parent)},
                   [theirs.fileno(), fd])
        finally:
            theirs.close()
            os.close(fd)
        slot.worker = worker
        threading.Thread(target=self._read_worker, args=(slot, worker),
                         name=f"resident-{job.job_id}", daemon=True).start()

    def _read_worker(self, slot: Slot, worker: Worker) -> None:
        while True:
            try:
                msg, fds = receive(worker.sock)
            except OSError:
                msg, fds = None, []
            for fd in fds:
                os.close(fd)
            with self._cond:
                if msg is None:
                    self._died(slot, worker, None)
                    self._cond.notify_all()
                    return
                if msg.get("event") == "ready":
                    worker.pid, worker.uid = int(msg["pid"]), int(msg["uid"])
                    worker.state = ResidentState.IDLE
                elif msg.get("event") == "done" and slot.last is not None \
                        and slot.last.seq == msg.get("seq"):
                    self._finish(slot.last, msg)
                    worker.state = ResidentState.IDLE
                    if msg.get("retire"):   # interrupted by a cancel: it exits now
                        self._died(slot, worker, None, "retired after a cancel")
                self._cond.notify_all()

    @staticmethod
    def _finish(act: Activation, msg: Mapping[str, Any]) -> None:
        act.result, act.error = msg.get("result"), msg.get("error")
        act.returncode = 0 if msg.get("ok") else 1
        act.state = WorkerState.EXITED if msg.get("ok") else WorkerState.FAILED
        act.timing = {k: float(msg[k]) for k in ("attach_s", "elapsed_s", "t_recv",
                                                   "t_done") if k in msg}

    def _died(self, slot: Slot, worker: Worker, returncode: int | None,
              how: str = "died") -> None:
        """Record a worker's end; fork its replacement (caller holds the condition)."""
        if returncode is None:
            returncode = worker.exit_rc
        first = worker.state != ResidentState.DEAD
        never_ready = worker.state == ResidentState.STARTING
        worker.state = ResidentState.DEAD
        act = slot.last
        if act is not None and act.pid == worker.pid and \
                act.state in (WorkerState.RUNNING, WorkerState.KILLED):
            act.state = WorkerState.KILLED
            if returncode is not None:
                act.returncode = returncode
                if returncode >= 0:
                    act.state = WorkerState.FAILED
        if not first:
            return
        with contextlib.suppress(OSError):
            worker.sock.close()
        if slot.worker is worker:
            slot.worker = None
            if never_ready:  # no fork loop: the next activate tries once more
                log.error("resident worker of %s died before it was ready; see %s",
                          slot.job.job_id, worker.log_path)
            elif slot.wanted and worker.zygote.ready and not self._closing \
                    and self._zygotes.get(slot.key) is worker.zygote:
                slot.restarts += 1
                log.warning("resident worker of %s (pid %d) %s; forking a new one",
                            slot.job.job_id, worker.pid, how)
                self._fork(slot)

    # -- requests --------------------------------------------------------------------
    def activate(self, job: JobRef, phase: Phase, request: dict[str, Any]) -> Activation:
        """Hand ``request`` (entry, args, env, this job's segments, maybe its own
        ``python``: None = the node daemon's) to the job's worker."""
        key = interpreter_of(request, job.uid)
        with self._cond:
            slot = self._slots.get(job.job_id)
            if slot is None or not slot.wanted:
                raise StateError(f"job {job.job_id!r} has no resident worker; register it")
            if slot.worker is not None and slot.worker.state == ResidentState.BUSY:
                raise StateError(f"job {job.job_id!r} already runs phase "
                                 f"{slot.last.phase.value if slot.last else '?'!r} "
                                 f"(pid {slot.worker.pid}); deactivate first")
            if slot.key != key:
                self._switch(slot, key)
            slot.error = None      # a failed interpreter is tried again, once per activate
            self._want_worker(slot)
            ready = self._cond.wait_for(
                lambda: self._closing or slot.error is not None or (
                    slot.worker is not None and slot.worker.state == ResidentState.IDLE),
                timeout=self.start_timeout_s)
            worker = slot.worker
            if self._closing:
                raise NodeUnavailable(f"job {job.job_id!r}: this node daemon takes no work "
                                      "now: " + (self.broken or "it is stopping"))
            if slot.error is not None:
                raise ConfigError(f"job {job.job_id!r}: no worker with its python: "
                                  f"{slot.error}")
            if not ready or worker is None:
                raise InsufficientResources(
                    f"job {job.job_id!r}: no resident worker became ready in "
                    f"{self.start_timeout_s} s (see {LOG_NAME} in the job directory)")
            if worker.uid != job.uid:
                raise StateError(f"resident worker {worker.pid} runs as uid {worker.uid}, "
                                 f"job {job.job_id!r} belongs to uid {job.uid}")
            slot.activations += 1
            act = Activation(slot.activations, phase, worker.pid, time.time(),
                             str(worker.log_path))
            send(worker.sock, {**request, "op": "run", "seq": act.seq,
                               "phase": phase.value, "uid": job.uid})
            worker.state = ResidentState.BUSY
            slot.last = act
            return act

    def cancel(self, job: JobRef, timeout_s: float) -> Activation | None:
        """Interrupt the running activation (SIGUSR1), SIGKILL after ``timeout_s``."""
        with self._cond:
            slot = self._slots.get(job.job_id)
            worker = slot.worker if slot else None
            if slot is None or worker is None or worker.state != ResidentState.BUSY:
                return slot.last if slot else None
            seq = slot.last.seq if slot.last else 0
            with contextlib.suppress(OSError):
                send(worker.sock, {"op": "cancel", "seq": seq})
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGUSR1)
            if not self._cond.wait_for(lambda: worker.state != ResidentState.BUSY,
                                       timeout=timeout_s):
                self._kill(worker)
                self._cond.wait_for(lambda: worker.state == ResidentState.DEAD,
                                    timeout=timeout_s)
            return slot.last

    def drop(self, job: JobRef) -> None:
        """Stop the job's worker for good."""
        with self._cond:
            slot = self._slots.pop(job.job_id, None)
            if slot is None:
                return
            slot.wanted = False
            worker = slot.worker
            self._retire_unused()
        if worker is not None:
            self._kill(worker)

    def status(self, job: JobRef) -> dict[str, Any] | None:
        with self._cond:
            slot = self._slots.get(job.job_id)
            if slot is None:
                return None
            w = slot.worker
            return {"worker_state": w.state.value if w else ResidentState.DEAD.value,
                    "pid": w.pid if w else None, "uid": w.uid if w else None,
                    "python": slot.key.python, "error": slot.error,
                    "activations": slot.activations, "restarts": slot.restarts,
                    "last": slot.last.to_json() if slot.last else None}

    def last(self, job: JobRef) -> Activation | None:
        with self._cond:
            slot = self._slots.get(job.job_id)
            return slot.last if slot else None

    @staticmethod
    def _kill(worker: Worker) -> None:
        if worker.pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            worker.sock.shutdown(socket.SHUT_RDWR)
