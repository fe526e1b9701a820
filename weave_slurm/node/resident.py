"""The worker side of a resident worker: one job's process that serves phase after phase.

A resident worker is forked by the zygote (already running as the job's uid when this
code runs) and stays alive between phases, so a phase switch costs neither a process
start nor ``import torch``, and a segment it attached before stays mapped (no page
faults on the second touch). Messages on its ``SOCK_SEQPACKET`` socket to the daemon:

    -> {"event": "ready", "pid": p, "uid": u}
    <- {"op": "run", "seq": n, "phase": ph, "entry": "mod:fn" | "/path/file.py:fn",
        "args": [...], "env": {...}, "root": dir, "uid": u, "segments": {name: path},
        "pythonpath": [...], "workdir": dir | null, "python": path | null,
        "output": path | null, "error": path | null}
    -> {"event": "done", "seq": n, "ok": bool, "result": JSON | null, "error": str | null,
        "attach_s": s, "elapsed_s": s, "t_recv": monotonic, "t_done": monotonic,
        "retire": true}                   (retire: only after a cancel; then it exits)
    <- {"op": "exit"}                                   (or end of stream: exit too)

    <- {"op": "cancel", "seq": n}                       (then SIGUSR1)

The worker runs each activation in ``workdir`` (none: its job directory) with
``pythonpath`` first on ``sys.path``; ``python`` is the interpreter it was forked with
(the pool picks the zygote: ``pool``, ``zygotes``); ``output``/``error`` (the job's
``--output``/``--error``, absolute) take its fds 1 and 2 while the phase runs, opened
as the job's uid (``job_streams``; a file it cannot open fails the phase). The entry
is called as ``fn(ctx)`` with a ``PhaseContext`` in the main thread. The daemon's ``deactivate``
sends ``cancel`` and then SIGUSR1: the signal raises
``PhaseCancelled`` inside a running entry; a cancel that came before the entry started
is found in the socket right after the worker marks itself running, so none is lost.
A worker that the signal interrupted retires after its reply (see ``_Cancel``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from weave_slurm.errors import ConfigError, SegmentMissing, StateError
from weave_slurm.node import preload
from weave_slurm.node.index import JobRef, SegmentIndex
from weave_slurm.node.job_streams import JobStreams
from weave_slurm.node.segments import AttachedState, SegmentStore, map_file, tensor_views
from weave_slurm.node.seqpacket import receive, send

log = logging.getLogger(__name__)

MAX_RESULT_BYTES = 1 << 15


class PhaseCancelled(Exception):
    """Raised inside a running entry when the daemon deactivates the phase."""


@dataclass(frozen=True)
class PhaseContext:
    """What an entry gets: its job, phase, arguments and the attached warm state."""

    job: JobRef
    phase: str
    args: tuple[str, ...]
    state: Mapping[str, AttachedState]
    activation: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Mapped:
    key: tuple[int, int, int]          # st_dev, st_ino, st_size of the .seg file
    storage: torch.UntypedStorage
    state: AttachedState


class AttachCache:
    """Keeps segments mapped between phases; remaps a segment only when its file changed."""

    def __init__(self) -> None:
        self._mapped: dict[str, _Mapped] = {}

    def attach(self, store: SegmentStore, job: JobRef,
               segments: Mapping[str, str]) -> dict[str, AttachedState]:
        for gone in set(self._mapped) - set(segments):
            del self._mapped[gone]
        out: dict[str, AttachedState] = {}
        for name, path in segments.items():
            if Path(path) != store.seg_path(job, name):
                raise StateError(f"segment {name!r} path {path!r} is not job "
                                 f"{job.job_id!r}'s {store.seg_path(job, name)}")
            try:
                index = store.read_index(job, name)
            except SegmentMissing:   # listed, then replaced or dropped by its writer (a
                self._mapped.pop(name, None)   # gang engine's slice): a phase that needs
                continue                       # it says so (it is not in its state)
            if not index.complete:
                raise StateError(f"segment {job.job_id}/{name} is torn: an update of "
                                 f"version {index.version} did not finish")
            out[name] = self._one(name, Path(path), index)
        return out

    def _one(self, name: str, path: Path, index: SegmentIndex) -> AttachedState:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size)
        if st.st_size != index.size_bytes:
            raise StateError(f"segment {path} is {st.st_size} B, its index says "
                             f"{index.size_bytes} B: torn write")
        old = self._mapped.get(name)
        if old is not None and old.key == key:
            if old.state.index == index:
                return old.state
            storage = old.storage
        else:
            self._mapped.pop(name, None)   # unmap the replaced file's old bytes first
            storage = map_file(path, st.st_size)
        state = AttachedState(index=index, tensors=tensor_views(storage, index), storage=storage)
        self._mapped[name] = _Mapped(key, storage, state)
        return state


def load_entry(spec: str, pythonpath: list[str]) -> Callable[[PhaseContext], Any]:
    """``"pkg.mod:fn"`` or ``"/abs/file.py:fn"`` -> the function (modules stay cached)."""
    target, sep, fn_name = spec.rpartition(":")
    if not sep or not target or not fn_name:
        raise ConfigError(f"entry {spec!r} must be 'module:function' or "
                          "'/path/file.py:function'")
    for extra in reversed(pythonpath):     # first on sys.path, in their order
        while extra in sys.path:
            sys.path.remove(extra)
        sys.path.insert(0, extra)
    if target.endswith(".py"):
        path = Path(target).resolve()
        mod_name = f"_weave_entry_{abs(hash((str(path), path.stat().st_mtime_ns)))}"
        module = sys.modules.get(mod_name)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(mod_name, path)
            if file_spec is None or file_spec.loader is None:
                raise ConfigError(f"entry file {path} cannot be loaded")
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            sys.modules[mod_name] = module
    else:
        module = importlib.import_module(target)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"entry {spec!r}: {fn_name!r} is not a function of {target!r}")
    return fn  # type: ignore[no-any-return]


class _Cancel:
    """SIGUSR1 raises PhaseCancelled while a phase runs, and is ignored otherwise.

    An exception raised at an arbitrary bytecode can leave the process half-changed: a
    module half imported (its submodules and global registrations stay, e.g. a
    dispatch rule or a torch library op, and the next import of it fails), a cache
    half filled. So a worker interrupted this way is never trusted again: it reports
    the cancel, says ``retire`` and exits, and the pool forks a clean one.
    """

    running = False
    fired = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.running:
            self.fired = True
            raise PhaseCancelled("phase deactivated by the node daemon")


def _result_json(value: object) -> tuple[object, str | None]:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError) as exc:
        return None, f"entry result is not JSON: {exc}"
    if len(text) > MAX_RESULT_BYTES:
        return None, f"entry result is {len(text)} B, more than {MAX_RESULT_BYTES} B"
    return value, None


def _cancelled(sock: socket.socket, seq: object) -> bool:
    """Drain messages that came while no entry ran; True if one cancels ``seq``."""
    found = False
    sock.setblocking(False)
    try:
        while True:
            try:
                msg, fds = receive(sock)
            except BlockingIOError:
                return found
            for fd in fds:
                os.close(fd)
            if msg is None or msg.get("op") == "exit":
                raise SystemExit(0)
            found = found or (msg.get("op") == "cancel" and msg.get("seq") == seq)
    finally:
        sock.setblocking(True)


def run_phase(request: dict[str, Any], job_id: str, cache: AttachCache,
              cancel: _Cancel, sock: socket.socket) -> dict[str, Any]:
    """Run one activation; returns the ``done`` message."""
    t_recv = time.monotonic()
    reply: dict[str, Any] = {"event": "done", "seq": request.get("seq"), "t_recv": t_recv,
                             "ok": False, "result": None, "error": None, "attach_s": 0.0}
    streams = JobStreams()
    try:
        job = JobRef(job_id, int(request["uid"]))
        streams.redirect(request.get("output"), request.get("error"))
        os.environ.update({str(k): str(v) for k, v in dict(request.get("env", {})).items()})
        preload.settle()   # what the zygote imported, kept only under the job's environment
        if request.get("workdir"):
            os.chdir(str(request["workdir"]))
        entry = load_entry(str(request["entry"]), list(request.get("pythonpath", [])))
        state = cache.attach(SegmentStore(Path(request["root"])), job,
                             dict(request.get("segments", {})))
        reply["attach_s"] = time.monotonic() - t_recv
        ctx = PhaseContext(job, str(request["phase"]), tuple(request.get("args", [])),
                           state, int(request.get("seq", 0)), dict(os.environ))
        cancel.running = True
        try:
            if _cancelled(sock, request.get("seq")):
                raise PhaseCancelled("phase deactivated by the node daemon")
            value = entry(ctx)
        finally:
            cancel.running = False
        reply["result"], reply["error"] = _result_json(value)
        reply["ok"] = reply["error"] is None
    except Exception as exc:  # report and keep serving; SystemExit ends the worker
        traceback.print_exc()
        reply["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        streams.restore()
    reply["t_done"] = time.monotonic()
    reply["elapsed_s"] = reply["t_done"] - t_recv
    return reply


def serve(sock: socket.socket, job_id: str) -> None:
    """The resident worker's loop; returns at ``exit`` or end of stream."""
    cancel = _Cancel()
    signal.signal(signal.SIGUSR1, cancel.handler)
    cache = AttachCache()
    send(sock, {"event": "ready", "pid": os.getpid(), "uid": os.getuid()})
    while True:
        request, fds = receive(sock)
        for fd in fds:
            os.close(fd)
        if request is None or request.get("op") == "exit":
            return
        if request.get("op") == "run":
            reply = run_phase(request, job_id, cache, cancel, sock)
            if cancel.fired:
                reply["retire"] = True
                print("resident worker: interrupted by a cancel; exiting (the daemon "
                      "forks a clean one)", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            send(sock, reply)
            if cancel.fired:
                _linger(sock)
                return


def _linger(sock: socket.socket, timeout_s: float = 10.0) -> None:
    """Read until the daemon closes its end (it does on ``retire``), then return.

    Exiting with an unread message (the ``cancel``) in this socket would reset the
    daemon's end (ECONNRESET) and lose the reply just sent.
    """
    sock.settimeout(timeout_s)
    try:
        while True:
            msg, fds = receive(sock)
            for fd in fds:
                os.close(fd)
            if msg is None:
                return
    except OSError:
        return
