"""What a resident pool (node/pool.py) keeps of its workers and their activations."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import WorkerState
from weave_slurm.node.zygotes import Interpreter, ZygoteProcess
from weave_slurm.vocab import Phase


class ResidentState(StrEnum):
    STARTING = "starting"    # fork requested, the worker has not said ready
    IDLE = "idle"            # alive, waiting for an activation
    BUSY = "busy"            # running an activation
    DEAD = "dead"            # exited; replaced unless the job is gone


@dataclass
class Activation:
    """One activation of a resident worker (mutable: filled in as it runs)."""

    seq: int
    phase: Phase
    pid: int
    started_s: float
    log_path: str
    state: WorkerState = WorkerState.RUNNING
    returncode: int | None = None
    result: object = None
    error: str | None = None
    timing: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase.value, "pid": self.pid, "state": self.state.value,
                "returncode": self.returncode, "started_s": self.started_s,
                "log_path": self.log_path, "resident": True, "activation": self.seq,
                "result": self.result, "error": self.error, **self.timing}


@dataclass
class Worker:
    """A resident worker as its pool knows it."""

    job: JobRef
    sock: socket.socket
    log_path: Path
    fork_seq: int
    zygote: ZygoteProcess
    state: ResidentState = ResidentState.STARTING
    pid: int = 0
    uid: int = -1
    forked_s: float = field(default_factory=time.time)
    exit_rc: int | None = None    # from the zygote, which may tell before the socket ends


@dataclass
class Slot:
    """One job's place in the pool: its worker, if any, and its last activation."""

    job: JobRef
    log_dir: Path
    worker: Worker | None = None
    last: Activation | None = None
    activations: int = 0
    restarts: int = 0
    wanted: bool = True
    key: Interpreter = field(default_factory=Interpreter)   # its workers' interpreter
    error: str | None = None      # why its interpreter's zygote cannot serve it
