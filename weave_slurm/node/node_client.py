"""Talking to a node daemon: the JSON-lines client and the put/attach helpers.

Bulk bytes never cross the socket: ``put_state`` asks the daemon to admit the
segment's size (budget) and to stage its files, writes the tensors straight into the
staged shared memory as the caller's uid (creating nothing), then asks the daemon to
commit it (see ``staging``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from weave_slurm.errors import NodeGone, StateError, WeaveError
from weave_slurm.node.index import DEFAULT_ALIGN_BYTES, JobRef, SegmentIndex, plan_layout
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import AttachedState, SegmentStore, dtype_name
from weave_slurm.node.staging import write_staged
from weave_slurm.wire import LineClient


class NodeClient(LineClient):
    """One connection to a node daemon; usable as a context manager. ``step_log``: the
    daemon is weaved's node-daemon step, whose output that is (None: one you start)."""

    server = "node daemon"
    start_hint = "start it with 'weave node serve'"
    unavailable = NodeGone

    def __init__(self, socket_path: Path, timeout_s: float = 120.0,
                 step_log: Path | None = None) -> None:
        if step_log is not None:   # the advice for who starts it: weaved, not the caller
            self.start_hint = (f"weaved starts it (its node-daemon step); waiting for "
                               f"that step, see its log {step_log}")
        super().__init__(socket_path, timeout_s)

    @classmethod
    def from_env(cls) -> NodeClient:
        """The node daemon a phase runs under (``WEAVE_NODE_SOCKET``, set by the daemon)."""
        socket_path = os.environ.get("WEAVE_NODE_SOCKET")
        if not socket_path:
            raise StateError("WEAVE_NODE_SOCKET is not set: phases run under a node daemon")
        return cls(Path(socket_path))

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
        """Write ``tensors`` as segment ``name`` of ``job``: put, write staged, commit.

        Raises ``StateError`` when the job was dropped (or this put was replaced by a
        newer one) before the commit; nothing of the write is then left on the node.
        """
        specs = [(k, dtype_name(t.dtype), tuple(t.shape)) for k, t in tensors.items()]
        entries, size = plan_layout(specs, DEFAULT_ALIGN_BYTES)
        reply = self.call(Op.PUT, job=job.job_id, name=name, nbytes=size)
        now = time.time()
        index = SegmentIndex(name=name, version=version, size_bytes=size,
                             align_bytes=DEFAULT_ALIGN_BYTES, tensors=entries,
                             created_s=now, updated_s=now, extra=dict(extra or {}))
        token = str(reply["token"])
        try:
            self._write_staged(reply, index, tensors)
        except FileNotFoundError as exc:
            raise StateError(f"put of {job.job_id}/{name}: its staged file {exc.filename} "
                             "is gone (the job was dropped on this node, or a newer put of "
                             "this segment replaced it); nothing was kept") from None
        except BaseException:
            with contextlib.suppress(WeaveError, OSError):
                self.call(Op.ABORT, job=job.job_id, name=name, token=token)
            raise
        self.call(Op.COMMIT, job=job.job_id, name=name, token=token)
        return index

    def _write_staged(self, reply: Mapping[str, Any], index: SegmentIndex,
                      tensors: Mapping[str, torch.Tensor]) -> None:
        """Fill the files the daemon staged (a seam for tests that race a drop)."""
        write_staged(Path(reply["stage_seg_path"]), Path(reply["stage_index_path"]),
                     index, tensors)

    def attach(self, job: JobRef, names: Collection[str] | None = None
               ) -> dict[str, AttachedState]:
        """``job``'s segments on this node, mapped zero-copy; only ``names`` of them
        where given (None: all). A reader of another job's (its rollout gang's) segments
        names what it reads: the others may be replaced by their writers meanwhile."""
        reply = self.call(Op.ATTACH_INFO, job=job.job_id)
        store = SegmentStore(Path(reply["root"]))
        return {name: store.attach_state(job, name) for name in reply["segments"]
                if names is None or name in names}
