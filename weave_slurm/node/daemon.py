"""The resident node daemon: holds every member job's warm state and runs its phases.

One daemon per node and store root (a lock held for the daemon's life; a second one
waits for the first to stop, then is refused: ``root_lock``). At start it loads the job
registry, re-adopts the valid segments of registered jobs, removes everything else (see
``startup``), then serves the JSON-lines protocol of ``protocol`` on a Unix socket, one
thread per connection. Every request that names a job is checked against the uid the
kernel reports for the caller (SO_PEERCRED): the job's owner or root only.

Locking: a short daemon-wide lock guards the registry, the budget and the worker
table; per job, a *state* lock serialises put/commit/checkpoint/restore/drop and a
*worker* lock serialises activate/deactivate/drop. So a long checkpoint of one job
delays neither ``status`` nor any request of another job, nor an ``activate`` of the
same job. A timer thread checkpoints every job whose interval passed (``autosave``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from weave_slurm import wire
from weave_slurm.config.sbatch import host_path
from weave_slurm.errors import ConfigError, InfeasibleRequest, StateError, WeaveError
from weave_slurm.node import protocol
from weave_slurm.node.autosave import AutosaveTimer, check_interval, run_timer
from weave_slurm.node.budget import MemoryBudget
from weave_slurm.node.checkpoint import CheckpointStore
from weave_slurm.node.gate_ops import GateOps
from weave_slurm.node.index import DEFAULT_ROOT, JobRef, check_name, is_scratch
from weave_slurm.node.leaving import OnLeave, leave
from weave_slurm.node.pool import ResidentPool
from weave_slurm.node.protocol import Op, Request
from weave_slurm.node.registry import JobRecord, JobRegistry
from weave_slurm.node.root_lock import RootLock, file_id, remove_own
from weave_slurm.node.segment_ops import SegmentOps
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.staging import StagingArea
from weave_slurm.node.startup import StartupReport, recover_store, remove_empty_root
from weave_slurm.node.status_view import node_status
from weave_slurm.node.tenancy import DeviceTenancy
from weave_slurm.node.worker import PhaseWorker, WorkerKind, job_segments, worker_env
from weave_slurm.vocab import Phase

if TYPE_CHECKING:
    from weave_slurm.node.remote import RemoteDoor

log = logging.getLogger(__name__)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = wire.BACKLOG


@dataclass(frozen=True)
class NodeConfig:
    """What a node daemon needs; ``host_mem_gib`` comes from the site config."""

    host_mem_gib: float
    root: Path = DEFAULT_ROOT
    socket_path: Path | None = None          # default: <root>/node.sock
    checkpoint_root: Path | None = None      # default: /var/tmp/weave-ckpt
    keep_checkpoints: int = 2
    stop_timeout_s: float = 10.0
    # a daemon still stopping on this root (its allocation ended, a new one started this
    # one on the same host) is waited for this long before the start is refused
    root_wait_s: float = 60.0
    checkpoint_interval_s: float = 600.0     # per job; 0 = no periodic checkpoints
    autosave_tick_s: float = 5.0             # how often the timer looks for due jobs
    resident_workers: bool = True            # zygote + one pre-forked worker per job
    resident_start_timeout_s: float = 120.0
    # the network door for weaved on another host (node/remote.py): None = local only
    listen_port: int | None = None
    listen_host: str = ""                    # "" = every address of this host
    trusted_uids: tuple[int, ...] = (0,)     # munge uids that may control this daemon
    munge_socket: str | None = None          # default: $MUNGE_SOCKET or munge's own
    node_name: str = ""                      # for messages (the hello names the node)

    @property
    def socket(self) -> Path:
        return self.socket_path or self.root / "node.sock"

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_root or Path("/var/tmp/weave-ckpt")


class NodeDaemon:
    """State and request handlers; ``serve`` puts them on the socket."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store = SegmentStore(config.root)
        self.ckpt = CheckpointStore(config.checkpoints, config.keep_checkpoints)
        self.budget = MemoryBudget(config.host_mem_gib)
        self.staging = StagingArea(self.store)
        self.registry = JobRegistry(config.root / "registry.json")
        self.workers: dict[str, PhaseWorker] = {}
        self.pool = ResidentPool(config.root, config.resident_start_timeout_s) \
            if config.resident_workers else None
        self.autosave = AutosaveTimer(config.checkpoint_interval_s)
        self.lock = threading.RLock()
        self._state_locks: dict[str, threading.RLock] = {}
        self._worker_locks: dict[str, threading.RLock] = {}
        self._last_kind: dict[str, WorkerKind] = {}    # job -> how its last phase ran
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.segments = SegmentOps(self)
        self.gates = GateOps(self)           # cooperative jobs: the gate, their processes
        self.tenancy = DeviceTenancy(self, config.socket)   # who holds the GPUs; switching them out
        self.door: RemoteDoor | None = None
        self.root_lock = RootLock(config.root)    # held for the daemon's life
        self.ended: str | None = None   # why it gave its root up (cli/node.py): refuses all
        self._socket_id: tuple[int, int] | None = None   # the socket file it bound
        self._node_lock = FileLock(str(config.root / ".lock"))
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._handlers: dict[Op, protocol.Handle] = {
            Op.REGISTER: self._register, Op.PUT: self.segments.put,
            Op.COMMIT: self.segments.commit, Op.ABORT: self.segments.abort,
            Op.ATTACH_INFO: self.segments.attach_info, Op.COPY: self.segments.copy,
            Op.DIGEST: self.segments.digest, Op.ACTIVATE: self._activate,
            Op.DEACTIVATE: self._deactivate, Op.PHASE: self._phase,
            Op.CHECKPOINT: self._checkpoint, Op.RESTORE: self._restore, Op.DROP: self._drop,
            Op.STATUS: lambda uid, _: node_status(self, uid), Op.ADOPT: self._adopt,
            Op.GATE: self.gates.gate, Op.LAUNCH: self.gates.launch,
            Op.LEAVE: lambda uid, _: leave(self.on_leave, uid),
        }
        self.on_leave: OnLeave | None = None   # set by ``weave node serve``

    # -- life cycle --------------------------------------------------------------
    def start(self) -> StartupReport:
        """Take the root, re-adopt or clean what a previous daemon left behind."""
        def waiting() -> None:
            log.info("node daemon: another daemon still holds %s; waiting up to %.0f s "
                     "for it to stop", self.config.root, self.config.root_wait_s)

        if not self.root_lock.acquire(self.config.root_wait_s, waiting):
            raise StateError(f"another node daemon serves {self.config.root} "
                             f"(lock {self.root_lock.path} is held)")
        with self._node_lock:
            self.registry.load()
            report = recover_store(self.store, set(self.registry.jobs()))
        for seg in report.adopted:
            self.budget.force(seg.job, seg.name, seg.size_bytes)
        now = time.monotonic()
        for job in self.registry.jobs():
            record = self.registry.get(job.job_id)
            self.autosave.track(job.job_id, now,
                                record.checkpoint_interval_s if record else None)
        if self.config.listen_port is not None:   # bind now: a taken port fails the start
            from weave_slurm.node.auth import Munge
            from weave_slurm.node.remote import RemoteDoor

            self.door = RemoteDoor(self.handle, self.config.listen_host,
                                   self.config.listen_port, Munge(self.config.munge_socket),
                                   frozenset(self.config.trusted_uids), self.config.node_name)
        if self.pool is not None:
            self.pool.start()
            for job in self.registry.jobs():
                self.pool.ensure(job, self.store.job_dir(job))
        if self.config.checkpoint_interval_s > 0 or any(
                (self.autosave.interval_s(j.job_id) or 0) > 0 for j in self.registry.jobs()):
            self._start_timer()
        log.info("node daemon on %s: adopted %d segments, removed %d paths",
                 self.config.root, len(report.adopted), len(report.removed))
        return report

    def serve(self, ready: threading.Event | None = None) -> None:
        """Serve the socket until ``shutdown`` (call ``start`` first)."""
        path = self.config.socket
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        daemon = self

        class _Conn(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                daemon._serve_connection(self.request)

        server = _UnixServer(str(path), _Conn)
        os.chmod(path, 0o666)  # anyone may ask; each request is checked by peer uid
        self._server, self._socket_id = server, file_id(path)
        if self.door is not None:
            threading.Thread(target=self.door.serve, name="node-door", daemon=True).start()
            log.info("node daemon %s: weaved's door on %s:%d (trusted uids %s)",
                     self.config.node_name, *self.door.address, list(self.config.trusted_uids))
        if ready is not None:
            ready.set()
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            server.server_close()
            remove_own(path, self._socket_id)   # not a newer daemon's at the same path

    def shutdown(self) -> None:
        """Stop serving, stop the workers, release the root (state stays in shm; a root
        with no job registered is removed)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()   # serve()'s own close may come after the root's
            remove_own(self.config.socket, self._socket_id)   # removal below
        if self.door is not None:
            self.door.shutdown()
        self._stop.set()
        if self._timer is not None:
            self._timer.join(30)
        self.gates.shutdown()
        if self.pool is not None:
            self.pool.shutdown()
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.stop(self.config.stop_timeout_s)
        if self.root_lock.held:
            with self.lock:
                empty = not self.registry.jobs()
            if empty:      # nothing warm to keep: leave nothing behind in /dev/shm
                remove_empty_root(self.config.root, self.root_lock)
            self.root_lock.release()
        elif self.ended is not None:   # given up with its socket still in it: if empty
            with contextlib.suppress(OSError):
                self.config.root.rmdir()

    # -- dispatch ----------------------------------------------------------------
    def handle(self, uid: int, request: Request) -> dict[str, Any]:
        """Answer one request from ``uid``; raises WeaveError on refusal."""
        if self.ended is not None and request.op is not Op.STATUS:
            raise StateError(f"this node daemon is stopping: {self.ended}")
        return self._handlers[request.op](uid, request)

    def state_lock(self, job_id: str) -> threading.RLock:
        """The lock of a job's state (put/commit/checkpoint/restore/drop)."""
        with self.lock:
            return self._state_locks.setdefault(job_id, threading.RLock())

    def worker_lock(self, job_id: str) -> threading.RLock:
        """The lock of a job's workers (activate/deactivate/drop)."""
        with self.lock:
            return self._worker_locks.setdefault(job_id, threading.RLock())

    # -- periodic checkpoints ----------------------------------------------------
    def _start_timer(self) -> None:
        if self._timer is None:
            self._timer = threading.Thread(
                target=run_timer, args=(self.autosave_tick, self._stop,
                                        self.config.autosave_tick_s),
                name="autosave", daemon=True)
            self._timer.start()

    def autosave_tick(self, now_s: float | None = None) -> dict[str, str]:
        """Checkpoint every due job whose segment versions changed; job -> outcome."""
        now = time.monotonic() if now_s is None else now_s
        outcome: dict[str, str] = {}
        for job_id in self.autosave.due(now):
            with self.lock:
                record = self.registry.get(job_id)
            if record is None:
                self.autosave.forget(job_id)
                continue
            try:
                outcome[job_id] = self._autosave_one(record.job)
            except (WeaveError, OSError) as exc:  # a bad tick must not stop the timer
                log.error("periodic checkpoint of %s failed: %s", job_id, exc)
                outcome[job_id] = f"failed: {exc}"
            self.autosave.mark(job_id, now)
        return outcome

    def _autosave_one(self, job: JobRef) -> str:
        with self.state_lock(job.job_id):
            versions = {s.name: s.index.version for s in self.store.list_segments(job)
                        if s.index is not None and not is_scratch(s.name)}
            if not versions:
                return "empty"
            found = self.ckpt.checkpoints(job)
            if found and self.ckpt.read(found[-1]).versions == versions:
                return "unchanged"
            info = self.ckpt.save(self.store, job)
        log.info("periodic checkpoint of %s: %s (%.1f s)", job.job_id, info.path,
                 info.elapsed_s)
        return "saved"

    def _serve_connection(self, sock: socket.socket) -> None:
        uid = protocol.peer_uid(sock)
        buf = bytearray()
        while True:
            try:
                line = protocol.read_line(sock, buf)
            except wire.LineTooLong as exc:
                wire.refuse_long_line(sock, exc)
                return  # the rest of the stream is not trustworthy framing any more
            if line is None:
                return
            try:
                request = Request.decode(line)
            except WeaveError as exc:
                sock.sendall(wire.fail(exc))
                continue
            sock.sendall(wire.encode(protocol.answer(self.handle, uid, request)))

    def job(self, uid: int, request: Request, what: str = "") -> JobRef:
        job_id = check_name("job id", request.job_id())
        with self.lock:
            record = self.registry.get(job_id)
        if record is None:
            if what:  # a step of a started write: the job went away in between
                raise StateError(f"{what} refused: job {job_id!r} is no longer registered "
                                 "on this node (dropped); nothing of it was kept")
            raise StateError(f"job {job_id!r} is not registered on this node; send "
                             "'register' first")
        if uid not in (0, record.job.uid):
            raise StateError(f"uid {uid} may not touch job {job_id!r}: it belongs to "
                             f"uid {record.job.uid}")
        return record.job

    # -- handlers ----------------------------------------------------------------
    def _register(self, uid: int, request: Request) -> dict[str, Any]:
        job_id = check_name("job id", request.job_id())
        owner = int(request.args.get("uid", uid)) if uid == 0 else uid
        interval = request.args.get("checkpoint_interval_s")
        if interval is not None:
            interval = check_interval(interval, f"register of {job_id!r}")
        if os.geteuid() not in (0, owner):
            raise InfeasibleRequest(f"this node daemon runs as uid {os.geteuid()}, not "
                                    f"root: it cannot hold state of uid {owner}")
        with self.lock:
            record = self.registry.get(job_id)
            if record is not None and record.job.uid != owner:
                raise StateError(f"job {job_id!r} is already registered to uid "
                                 f"{record.job.uid}")
            job = JobRef(job_id, owner)
            if record is None:
                self.store.ensure_job_dir(job)
                with self._node_lock:
                    self.registry.add(JobRecord(job, time.time(), interval))
                    self.registry.save()
                self.autosave.track(job_id, time.monotonic(), interval)
                if interval:
                    self._start_timer()
        if self.pool is not None and request.args.get("resident", True):  # not cooperative
            self.pool.ensure(job, self.store.job_dir(job))
        return {"job": job_id, "uid": owner, "root": str(self.store.root),
                "job_dir": str(self.store.job_dir(job))}

    @contextmanager
    def job_state(self, uid: int, request: Request, what: str = "") -> Iterator[JobRef]:
        """The job, checked again once its state lock is held (a drop may have won it)."""
        job = self.job(uid, request, what)
        with self.state_lock(job.job_id):
            yield self.job(uid, request, what)

    def _activate(self, uid: int, request: Request) -> dict[str, Any]:
        if request.args.get("external"):     # a grant to a cooperative job's process
            return self.gates.activate(uid, request, self._last_kind)
        job = self.job(uid, request)
        phase = Phase.parse(request.args.get("phase"))
        extra = request.args.get("env") or {}
        if not isinstance(extra, dict):
            raise ConfigError(f"activate of {job.job_id}: 'env' must be an object")
        with self.worker_lock(job.job_id):
            self._refuse_if_running(job)
            segments = job_segments(self.store, job)
            env = worker_env(self.store, job, phase, self.config.socket, segments)
            env = {**{str(k): str(v) for k, v in extra.items()}, **env}
            if request.args.get("entry") is not None:
                return {**self._activate_resident(job, phase, request, env, segments),
                        "env": env}
            argv = request.args.get("argv")
            log_path = self.store.job_dir(job) / f"{phase.value}.log"
            worker = PhaseWorker(job, phase, argv if isinstance(argv, list) else [], env,
                                 log_path)
            with self.lock:
                self.workers[job.job_id] = worker
                self._last_kind[job.job_id] = WorkerKind.PROCESS
            return {**worker.status().to_json(), "env": env}

    def _activate_resident(self, job: JobRef, phase: Phase, request: Request,
                           env: dict[str, str], segments: dict[str, Path]) -> dict[str, Any]:
        if self.pool is None:
            raise InfeasibleRequest("this node daemon runs without resident workers "
                                    "(resident_workers=false): activate with 'argv'")
        entry, args = request.args.get("entry"), request.args.get("args") or []
        pythonpath = request.args.get("pythonpath") or []
        code = {k: request.args.get(k)
                for k in ("workdir", "python", "output", "error", "container")}
        for key in ("output", "error"):   # their %N: this node (config/sbatch.host_path)
            value = code[key]
            if isinstance(value, str):
                code[key] = host_path(value, self.config.node_name)
        if not isinstance(entry, str) or not isinstance(args, list) or \
                not isinstance(pythonpath, list):
            raise ConfigError(f"activate of {job.job_id}: 'entry' must be a string "
                              f"'module:function', 'args' and 'pythonpath' lists")
        for key, value in code.items():   # output/error: the job's files (job_streams)
            if value is not None and not (isinstance(value, str) and os.path.isabs(value)):
                raise ConfigError(f"activate of {job.job_id}: {key!r} must be an absolute "
                                  f"path or null, got {value!r}")
        # the job's own python runs as the job's uid (pool, zygotes): no check here
        tenant = request.args.get("tenant")
        self.tenancy.make_room(job, tenant if isinstance(tenant, str) else job.job_id,
                               {**code, "pythonpath": pythonpath})
        act = self.pool.activate(job, phase, {
            "entry": entry, "args": [str(a) for a in args], "env": env,
            "pythonpath": [str(p) for p in pythonpath], "root": str(self.store.root),
            "segments": {k: str(v) for k, v in segments.items()},
            **code})
        with self.lock:
            self._last_kind[job.job_id] = WorkerKind.RESIDENT
        return {"job": job.job_id, **act.to_json()}

    def _refuse_if_running(self, job: JobRef) -> None:
        with self.lock:
            current = self.workers.get(job.job_id)
        if current is not None and current.status().returncode is None:
            raise StateError(f"job {job.job_id!r} already runs phase "
                             f"{current.phase.value!r} (pid {current.pid}); deactivate first")

    def worker_json(self, job: JobRef) -> dict[str, Any] | None:
        with self.lock:
            kind = self._last_kind.get(job.job_id)
            worker = self.workers.get(job.job_id)
        if kind is WorkerKind.EXTERNAL:
            return self.gates.last(job)
        if kind is WorkerKind.RESIDENT and self.pool is not None:
            act = self.pool.last(job)
            return None if act is None else {"job": job.job_id, **act.to_json()}
        return None if worker is None else dict(worker.status().to_json())

    def _deactivate(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.job(uid, request)
        with self.worker_lock(job.job_id):
            with self.lock:
                kind = self._last_kind.get(job.job_id)
                worker = self.workers.get(job.job_id)
            if kind is WorkerKind.EXTERNAL:
                return self.gates.cancel(job)
            if kind is WorkerKind.RESIDENT and self.pool is not None:
                self.pool.cancel(job, self.config.stop_timeout_s)
                return self.worker_json(job) or {}
            if worker is None:
                raise StateError(f"job {job.job_id!r} has no phase worker on this node")
            return dict(worker.stop(self.config.stop_timeout_s).to_json())

    def _phase(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.job(uid, request)
        return {"job": job.job_id, "worker": self.worker_json(job),
                "gate": self.gates.info(job)}

    def _checkpoint(self, uid: int, request: Request) -> dict[str, Any]:
        with self.job_state(uid, request) as job:
            info = self.ckpt.save(self.store, job)
        self.autosave.mark(job.job_id, time.monotonic())
        return info.to_json()

    def _restore(self, uid: int, request: Request) -> dict[str, Any]:
        with self.job_state(uid, request) as job:
            version = request.args.get("version")   # a gang rank: the committed one
            path = self.ckpt.latest(job, None if version is None else int(version))
            indexes = self.ckpt.indexes(path)
            with self.lock:
                for index in indexes:  # all or nothing: check the whole checkpoint first
                    self.budget.check(job, index.name, index.size_bytes)
                for index in indexes:
                    self.budget.charge(job, index.name, index.size_bytes)
            return self.ckpt.restore(self.store, job, path,
                                     drop_cache=bool(request.args.get("drop_cache"))).to_json()

    def _drop(self, uid: int, request: Request) -> dict[str, Any]:
        job = self.job(uid, request)
        with self.worker_lock(job.job_id), self.state_lock(job.job_id):
            with self.lock:
                worker = self.workers.pop(job.job_id, None)
                self._last_kind.pop(job.job_id, None)
            if worker is not None:
                worker.stop(self.config.stop_timeout_s)
            if self.pool is not None:
                self.pool.drop(job)
            self.gates.drop(job)
            self.tenancy.forget(job)
            self.autosave.forget(job.job_id)
            self.staging.forget_job(job)
            self.store.delete_job(job)
            if not request.args.get("keep_checkpoints"):
                self.ckpt.delete_job(job)
            with self.lock:
                self.budget.release_job(job)
                with self._node_lock:
                    self.registry.remove(job.job_id)
                    self.registry.save()
        return {"job": job.job_id, "dropped": True}

    def _adopt(self, uid: int, request: Request) -> dict[str, Any]:
        """Copy in the job's newest checkpoint from a lost node's checkpoint root."""
        if uid != 0:
            raise StateError("adopt: only root (weaved) may move checkpoints between "
                             "nodes")
        src = request.args.get("from_root")
        if not isinstance(src, str) or not os.path.isabs(src):
            raise ConfigError(f"adopt: from_root must be an absolute path, got {src!r}")
        with self.job_state(uid, request) as job:
            if Path(src).resolve() == self.ckpt.root.resolve():
                raise ConfigError(f"adopt: from_root {src} is this node's own root")
            info = self.ckpt.adopt(CheckpointStore(Path(src)), job)
        log.info("adopted checkpoint of %s from %s: %s", job.job_id, src, info.path)
        return info.to_json()
