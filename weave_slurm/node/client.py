"""Talking to a node daemon: the JSON-lines client and the put/attach helpers.

Bulk bytes never cross the socket: ``put_state`` asks the daemon to admit the
segment's size (budget), writes the tensors straight into shared memory as the
caller's uid, then asks the daemon to commit it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weave_slurm.node.index import DEFAULT_ALIGN_BYTES, JobRef, SegmentIndex, plan_layout
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import AttachedState, SegmentStore, dtype_name
from weave_slurm.wire import LineClient


class NodeClient(LineClient):
    """One connection to a node daemon; usable as a context manager."""

    server = "node daemon"
    start_hint = "start it with 'weave node serve'"

    def __init__(self, socket_path: Path, timeout_s: float = 120.0) -> None:
        super().__init__(socket_path, timeout_s)

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        """Send one request; return its result or raise the error it names."""
        return self.request({"op": op.value, **args})

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
