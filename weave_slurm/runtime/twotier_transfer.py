"""The ``twotier`` transfer: a group's segments between hosts, through its sync agents.

One agent per node of the group (:mod:`weave_slurm.runtime.agents`), started on first
use and kept until the layout ends (:meth:`TwoTierTransfer.relayout`: the group gained
or retired nodes; the next copy starts agents over the new layout). For a copy of
segment ``name`` from ``src``:

- to rollout nodes, from a training node: the two-tier sync (stage 1: one sharded copy
  in parallel point-to-point streams over the slow inter-pool link; stage 2: relay
  inside the rollout pool), version-checked by the rollout agents' ledger. A training
  gang over several nodes (``senders``: each other node's first rank, holding the
  same version) sends from every training node at once, each node its own share of
  the streams (:func:`~weave_slurm.sync.topology.plan_streams`);
- to any other node (a rollout's trajectories to its training node): point to point,
  one agent sends, the other takes;
- onto ``src`` itself under another name (a staleness ring buffer): ``src``'s node
  daemon copies it locally (``copy``), CRC-checked.

Where weaved shares the host with the nodes (no node is remote), the last two stay the
shared-memory handoff (:class:`~weave_slurm.runtime.transfer.ShmTransfer`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from weave_slurm.errors import StateError, WeaveError
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.agents import AgentGroup, AgentKey, Launcher
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.runtime.transfer import ClientFactory, NodeCall, ShmTransfer, TransferConfig
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

RECORDS_KEPT = 1024


@dataclass
class SyncRecord:
    """One two-tier sync as the runner saw it (for profiling and benchmarks)."""

    job_id: str
    name: str
    version: int
    elapsed_s: float
    slow_link_bytes: int
    node_bytes: int
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)


class TwoTierTransfer:
    """Segments between a group's nodes through its agents (see module doc)."""

    def __init__(self, layout: GroupLayout, clients: ClientFactory, config: TransferConfig,
                 call: NodeCall | None = None, launcher: Launcher | None = None) -> None:
        self.layout, self.clients, self.config = layout, clients, config
        self.call, self.launcher = call, launcher
        self.local = not any(n.remote for n in (*layout.train, *layout.rollout))
        self.shm = ShmTransfer(clients)
        self.agents: AgentGroup | None = None
        self.records: deque[SyncRecord] = deque(maxlen=RECORDS_KEPT)
        self._seq = 0

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None,
             senders: Sequence[tuple[NodeRef, JobRef]] = ()) -> tuple[int, int]:
        synced = [d for d in dsts if src.pool is Pool.TRAIN and d.pool is Pool.ROLLOUT
                  and d != src]
        rest = [d for d in dsts if d not in synced]
        version, moved = -1, 0
        if rest and self.local:
            version, moved = self.shm.copy(src, rest, job, name, as_name)
        elif rest:
            for dst in rest:
                v, m = self._copy_one(src, dst, job, name, as_name)
                version, moved = v, moved + m
        if synced:
            version, sent = self._push(src, synced, job, name, as_name, senders)
            moved += sent
        return version, moved

    def _copy_one(self, src: NodeRef, dst: NodeRef, job: JobRef, name: str,
                  as_name: str | None) -> tuple[int, int]:
        if dst == src:
            if as_name is None or as_name == name:
                return -1, 0          # already there
            assert self.call is not None, "a remote node needs the runner's node link"
            reply = self.call(src, Op.COPY, job=job.job_id, name=name, as_name=as_name)
            return int(reply["version"]), int(reply["size_bytes"])
        agents = self._agents()
        self._seq += 1
        base = {"job": job.job_id, "uid": job.uid, "name": name, "seq": self._seq}
        s, d = (src.pool, src.name), (dst.pool, dst.name)
        replies = agents.request({
            s: {"op": "send", **base, "dst": dst.name, "dst_pool": dst.pool.value},
            d: {"op": "take", **base, "src": src.name, "src_pool": src.pool.value,
                "as_name": as_name}}, 3 * self.config.timeout_s + 10.0)
        return int(replies[d]["version"]), int(replies[d]["bytes"])

    def _push(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
              as_name: str | None,
              senders: Sequence[tuple[NodeRef, JobRef]] = ()) -> tuple[int, int]:
        agents = self._agents()
        start = time.perf_counter()
        held = [(src, job), *senders]           # every training node that sends
        base: dict[str, Any] = {"job": job.job_id, "uid": job.uid, "name": name,
                                "src": src.name, "srcs": [n.name for n, _ in held],
                                "dsts": [d.name for d in dsts], "crc": as_name is not None}
        train = (Pool.TRAIN, src.name)
        prepared = agents.request({(Pool.TRAIN, n.name): {"op": "prepare", **base,
                                                          "seg_job": j.job_id}
                                   for n, j in held}, self.config.timeout_s)
        index = dict(prepared[train]["index"])
        version = base["version"] = int(index["version"])
        other = {k[1]: r["index"]["version"] for k, r in prepared.items()
                 if (int(r["index"]["version"]), int(r["index"]["size_bytes"]))
                 != (version, int(index["size_bytes"]))}
        if other:
            raise StateError(f"job {job.job_id}: {name} v{version} on {src.name}, but the "
                             f"gang's other training nodes hold {other}: not one version")
        requests: dict[AgentKey, dict[str, Any]] = {(Pool.TRAIN, n.name): {"op": "push", **base}
                                                    for n, _ in held}
        for d in dsts:
            requests[(Pool.ROLLOUT, d.name)] = {"op": "recv", **base, "index": index,
                                                "as_name": as_name}
        replies = agents.request(requests, 3 * self.config.timeout_s + 10.0)
        elapsed = time.perf_counter() - start
        push = replies[(Pool.TRAIN, src.name)]
        if as_name is not None:
            bad = [k[1] for k, r in replies.items() if r.get("crc") != push.get("crc")]
            if bad:
                raise StateError(f"job {job.job_id}: {name} v{version} as {as_name} on "
                                 f"{', '.join(bad)} does not match its source's CRC32")
        node_bytes = int(index["size_bytes"]) * len(dsts)
        slow = sum(int(replies[(Pool.TRAIN, n.name)].get("slow_link_bytes", 0))
                   for n, _ in held)      # every sender's share
        self.records.append(SyncRecord(job.job_id, name, version, elapsed, slow, node_bytes,
                                       {f"{k[0].value}:{k[1]}": v for k, v in replies.items()}))
        return version, node_bytes

    def _agents(self) -> AgentGroup:
        if self.agents is not None and self.agents.stopped:
            self.agents = None           # stopped after a failure: start afresh
        if self.agents is None:
            if self.call is not None:   # a node that does not answer fails this at once,
                for node in (*self.layout.train, *self.layout.rollout):   # not in 120 s
                    self.call(node, Op.STATUS)
            self.agents = AgentGroup(self.layout, self.config.timeout_s,
                                     self.config.start_timeout_s, self.config.mode,
                                     self.launcher)
            try:
                self.agents.start()
            except BaseException:
                self.agents.stop()
                self.agents = None
                raise
        return self.agents

    def forget(self, job: JobRef) -> None:
        """Drop the job's sync state on every agent: it was restored from a checkpoint
        (its versions start over) or it left the group (its buffers are freed)."""
        if self.agents is None or self.agents.stopped:
            return
        try:
            self.agents.request({k: {"op": "forget", "job": job.job_id}
                                 for k in self.agents.nodes()}, self.config.timeout_s)
        except WeaveError as exc:   # agents restarted: fresh ledgers anyway
            log.info("forget %s on the sync agents: %s", job.job_id, exc)

    def arm_die(self, node: NodeRef) -> int:
        """Test hook: the agent of ``node`` kills itself on its next payload receive;
        returns its pid."""
        agents = self._agents()
        key = (node.pool, node.name)
        agents.request({key: {"op": "arm_die"}}, self.config.timeout_s)
        return agents.pid(key)

    def relayout(self, layout: GroupLayout) -> None:
        """The group's nodes changed: the agents form one world over a layout (a rank
        per node), so they are stopped; the next copy starts them over ``layout``, with
        fresh ledgers."""
        self.close()
        self.layout = layout
        self.local = not any(n.remote for n in (*layout.train, *layout.rollout))

    def close(self) -> None:
        if self.agents is not None:
            self.agents.stop()
            self.agents = None
