"""Talking to a node daemon: the JSON-lines client and the put/attach helpers.

Bulk bytes never cross the socket: ``put_state`` asks the daemon to admit the
segment's size (budget), writes the tensors straight into shared memory as the
caller's uid, then asks the daemon to commit it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weave_slurm.errors import StateError
from weave_slurm.node import protocol
from weave_slurm.node.index import DEFAULT_ALIGN_BYTES, JobRef, SegmentIndex, plan_layout
from weave_slurm.node.protocol import Op, Request
from weave_slurm.node.segments import AttachedState, SegmentStore, dtype_name


class NodeClient:
    """One connection to a node daemon; usable as a context manager."""

    def __init__(self, socket_path: Path, timeout_s: float = 120.0) -> None:
        self.socket_path = Path(socket_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(self.socket_path))
        except OSError as exc:
            self._sock.close()
            raise StateError(f"no node daemon at {self.socket_path}: {exc}; start it "
                             "with 'weave node serve'") from exc
        self._buf = bytearray()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        """Send one request; return its result or raise the error it names."""
        self._sock.sendall(Request(op, args).encode())
        line = protocol.read_line(self._sock, self._buf)
        if line is None:
            raise StateError(f"node daemon at {self.socket_path} closed the connection")
        return protocol.raise_for(json.loads(line))

    # -- conveniences ------------------------------------------------------------
    def register(self, job_id: str, uid: int | None = None,
                 checkpoint_interval_s: float | None = None) -> JobRef:
        """Register ``job_id`` (root may name its ``uid``); pre-forks its resident worker."""
        args: dict[str, Any] = {"job": job_id}
        if uid is not None:
            args["uid"] = uid
        if checkpoint_interval_s is not None:
            args["checkpoint_interval_s"] = checkpoint_interval_s
        reply = self.call(Op.REGISTER, **args)
        return JobRef(reply["job"], int(reply["uid"]))

    def put_state(self, job: JobRef, name: str, tensors: Mapping[str, torch.Tensor],
                  version: int, extra: Mapping[str, Any] | None = None) -> SegmentIndex:
        specs = [(k, dtype_name(t.dtype), tuple(t.shape)) for k, t in tensors.items()]
        reply = self.call(Op.PUT, job=job.job_id, name=name,
                          nbytes=plan_layout(specs, DEFAULT_ALIGN_BYTES)[1])
        store = SegmentStore(Path(reply["root"]), align_bytes=int(reply["align_bytes"]))
        index = store.put_state(job, name, tensors, version, extra)
        self.call(Op.COMMIT, job=job.job_id, name=name)
        return index

    def attach(self, job: JobRef) -> dict[str, AttachedState]:
        reply = self.call(Op.ATTACH_INFO, job=job.job_id)
        store = SegmentStore(Path(reply["root"]))
        return {name: store.attach_state(job, name) for name in reply["segments"]}
