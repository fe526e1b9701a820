"""A node's sync agent: one rank of its group's world, moving segments between hosts.

``python -m weave_slurm.sync.agent SPEC`` (SPEC: an :class:`AgentSpec` as JSON). One
agent runs on each node of a group, as a one-task step of the node's allocation
(``Backend.open_step``), started once per group layout by the runner's transfer (a
process with torch imported costs ~1.5 s to start; a sync costs milliseconds). Its
stdin and stdout are its control channel (JSON lines; on Slurm they travel over
srun's own authenticated I/O forwarding, so no port of its own is open); everything
else it prints goes to stderr. The agents form one gloo process group over TCP on
the nodes' addresses: rank 0 (the first training node's agent) picks the rendezvous
port and says ``RENDEZVOUS tcp://<addr>:<port>`` before it waits for the others, who
are started with that address; each says ``READY`` once the world is formed. Requests:

- ``prepare``: attach segment ``name`` of ``job`` zero-copy from this node's daemon
  (``/dev/shm``) and hold it; reply with its index (the version to announce).
- ``push``: send this rank's pieces of the prepared segment.
- ``recv``: receive the version into a buffer kept per member (allocated once), then
  put it into this node's daemon (``NodeClient.put_state``: version-tagged and
  budget-checked); a checked buffer (``as_name``) gets the CRC32 of the bytes in its
  index and is read back.
- ``send`` / ``take``: move one segment (any: a rollout's trajectories) from this
  agent's node to another's, point to point: ``send`` attaches it zero-copy and sends
  its index and bytes to ``dst``; ``take`` receives them from ``src`` and puts them
  into its node's daemon (``as_name``: under that name).
- ``forget``: the runtime restored ``job`` from a checkpoint: its versions start over.
- ``arm_die`` (test hook): SIGKILL this agent when it next posts a payload receive.
- ``ping`` / ``stop``.

Every reply is ``{"ok": true, ...}`` or ``{"ok": false, "error": <class>, "message":
<one line>}``. A stale or duplicate version is refused by the rollout agents' version
ledger (``VersionMismatch``); corrupt pieces are retried once (``ShardCorrupt`` after
that); a dead peer surfaces as ``SyncError`` within the transport's timeout. The agent
exits when its stdin closes, so it never outlives its runner.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from weave_slurm import wire
from weave_slurm.errors import ConfigError, StateError, VersionMismatch, WeaveError
from weave_slurm.node.crc import CRC_KEY, storage_crc32
from weave_slurm.node.index import DTYPE_ITEMSIZE, JobRef, SegmentIndex
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import AttachedState, SegmentStore, tensor_views
from weave_slurm.slurm.allocation_watch import interval_from, start_watch
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.netif import use_interface_towards
from weave_slurm.sync.pieces import crc32_into, is_payload_tag
from weave_slurm.sync.subgroup import SubTransport, member_topology
from weave_slurm.sync.topology import PoolNodes, ShardLayout, build_topology
from weave_slurm.sync.transport import Pending, TorchTransport
from weave_slurm.sync.twotier import DEFAULT_CHUNK_NBYTES, SyncConfig, SyncReport, TwoTierSync
from weave_slurm.sync.version_ledger import VersionLedger
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 16 << 20
#: Point-to-point segment moves use tags from here (the two-tier sync's are far below).
P2P_TAG_BASE = 1 << 30


@dataclass(frozen=True)
class AgentSpec:
    """What one agent process needs: its rank in the group's world and its node."""

    rank: int
    world: tuple[tuple[str, str], ...]      # (pool, node name) of every global rank
    init_method: str                        # tcp://<first training node>:<port>
    node_socket: str                        # this node's daemon
    timeout_s: float                        # the runner's (site [runtime] sync_timeout_s)
    mode: str                               # SyncMode name: full | delta
    chunk_nbytes: int = DEFAULT_CHUNK_NBYTES

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> AgentSpec:
        raw = json.loads(text)
        raw["world"] = tuple(tuple(w) for w in raw["world"])
        return cls(**raw)


class _DyingSub(SubTransport):
    """Test hook: SIGKILL this process when it posts a payload receive while armed."""

    armed = False

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Pending:
        if type(self).armed and is_payload_tag(tag):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().irecv(buf, src, tag)


@dataclass
class _MemberSync:
    """One member's sync between its training node and its rollout nodes, on this rank."""

    sync: TwoTierSync
    buf: torch.Tensor | None = None           # rollout side: the receive buffer (reused)
    size_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _word_bytes(index: SegmentIndex) -> int:
    return min((DTYPE_ITEMSIZE[e.dtype] for e in index.tensors), default=1)


class SyncAgent:
    """One rank: its transport to the group, its node daemon, one ledger for all jobs."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self.world = build_topology([PoolNodes(Pool(p), n, 1) for p, n in spec.world])
        self.global_rank = {(r.pool.value, r.node): r.rank for r in self.world.ranks}
        self.node = NodeClient(Path(spec.node_socket))
        self.ledger = VersionLedger()
        self.mode = SyncMode[spec.mode.upper()]
        self.t: TorchTransport | None = None
        self._members: dict[tuple[str, tuple[str, ...], tuple[str, ...], int, int],
                            _MemberSync] = {}
        self._prepared: dict[tuple[str, str], AttachedState] = {}

    def connect(self, init_method: str) -> None:
        self.t = TorchTransport(self.world, self.spec.rank, init_method, self.spec.timeout_s)

    # -- requests ----------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            return {"rank": self.spec.rank, "pid": os.getpid()}
        if op == "prepare":
            return self._prepare(req)
        if op == "push":
            return self._push(req)
        if op == "recv":
            return self._recv(req)
        if op == "send":
            return self._send(req)
        if op == "take":
            return self._take(req)
        if op == "forget":
            self.ledger.forget(str(req["job"]))
            for key in [k for k in self._members if k[0] == req["job"]]:
                del self._members[key]
            return {}
        if op == "arm_die":
            _DyingSub.armed = True
            return {}
        raise ConfigError(f"sync agent: unknown op {op!r}; valid: ping, prepare, push, "
                          "recv, send, take, forget, arm_die, stop")

    def _member(self, req: dict[str, Any], size_bytes: int, word_bytes: int) -> _MemberSync:
        srcs = tuple(str(s) for s in req.get("srcs") or [req["src"]])   # every sender
        dsts = tuple(str(d) for d in req["dsts"])
        key = (str(req["job"]), srcs, dsts, size_bytes, word_bytes)
        found = self._members.get(key)
        if found is not None:
            return found
        assert self.t is not None, "connect() first"
        topo = member_topology(srcs, dsts)
        ranks = [*(self.global_rank[(Pool.TRAIN.value, s)] for s in srcs),
                 *(self.global_rank[(Pool.ROLLOUT.value, d)] for d in dsts)]
        sub = _DyingSub(self.t, topo, ranks)
        layout = ShardLayout(size_bytes, len(dsts))
        config = SyncConfig(str(req["job"]), self.mode, chunk_nbytes=self.spec.chunk_nbytes)
        made = _MemberSync(TwoTierSync(sub, topo, layout, word_bytes, config, self.ledger))
        if sub.rank not in topo.train_ranks:     # a receiver
            made.buf = torch.zeros(layout.padded_nbytes, dtype=torch.uint8)
        self._members[key] = made
        return made

    def _prepare(self, req: dict[str, Any]) -> dict[str, Any]:
        """Attach the segment and hold it for the push: the version the rollout agents
        are told is the version that is sent, whatever the node writes meanwhile."""
        job = JobRef(str(req["job"]), int(req["uid"]))
        name = str(req["name"])
        held = JobRef(str(req.get("seg_job") or job.job_id), job.uid)  # a gang rank's node
        info = self.node.call(Op.ATTACH_INFO, job=held.job_id)
        if name not in info["segments"]:
            raise StateError(f"job {held.job_id}: node {req['src']} has no segment {name!r} "
                             f"(has {sorted(info['segments'])})")
        attached = SegmentStore(Path(info["root"])).attach_state(held, name)
        self._prepared[(job.job_id, name)] = attached
        return {"index": attached.index.to_json()}

    def _push(self, req: dict[str, Any]) -> dict[str, Any]:
        job = JobRef(str(req["job"]), int(req["uid"]))
        name, version = str(req["name"]), int(req["version"])
        attached = self._prepared.pop((job.job_id, name), None)
        if attached is None:
            raise StateError(f"job {job.job_id}: push of {name!r} without a prepare")
        if attached.index.version != version:
            raise VersionMismatch(f"job {job.job_id}: segment {name!r} on node "
                                  f"{req['src']} holds version {attached.index.version}, "
                                  f"the runner announced {version}")
        flat = torch.empty(0, dtype=torch.uint8).set_(attached.storage)   # zero-copy
        ms = self._member(req, attached.index.size_bytes, _word_bytes(attached.index))
        report = ms.sync.push(flat, version)
        out = _report(report)
        if req.get("crc"):
            out["crc"] = storage_crc32(attached.storage)
        return out

    def _recv(self, req: dict[str, Any]) -> dict[str, Any]:
        job = JobRef(str(req["job"]), int(req["uid"]))
        index = SegmentIndex.loads(json.dumps(req["index"]), f"{job.job_id}/{req['name']}")
        ms = self._member(req, index.size_bytes, _word_bytes(index))
        assert ms.buf is not None
        report = ms.sync.receive(ms.buf)
        if report.version != index.version:
            raise VersionMismatch(f"job {job.job_id}: received weight version "
                                  f"{report.version}, the runner announced {index.version}")
        dst = str(req.get("as_name") or req["name"])
        views = tensor_views(ms.buf.untyped_storage(), index)
        extra = dict(index.extra)
        out = _report(report)
        if req.get("crc"):
            extra[CRC_KEY] = out["crc"] = crc32_into(ms.buf[:index.size_bytes])
        t0 = time.perf_counter()
        self.node.put_state(job, dst, views, index.version, extra)
        out["put_s"] = time.perf_counter() - t0
        if req.get("crc"):
            info = self.node.call(Op.ATTACH_INFO, job=job.job_id)
            written = SegmentStore(Path(info["root"])).attach_state(job, dst)
            if written.index.version != index.version or \
                    storage_crc32(written.storage) != out["crc"]:
                raise VersionMismatch(f"job {job.job_id}: {dst} v{index.version} on node "
                                      f"{self.spec.node_socket} does not match the bytes "
                                      f"received (CRC32 {out['crc']:#010x})")
        return out


    # -- point to point ------------------------------------------------------------------
    def _peer(self, req: dict[str, Any], key: str) -> int:
        pool, node = str(req[f"{key}_pool"]), str(req[key])
        rank = self.global_rank.get((pool, node))
        if rank is None:
            raise ConfigError(f"sync agent: no {pool} node {node!r} in this group's world")
        return rank

    def _send(self, req: dict[str, Any]) -> dict[str, Any]:
        """Segment ``name`` of this node to agent ``dst``: its index, then its bytes."""
        assert self.t is not None, "connect() first"
        job = JobRef(str(req["job"]), int(req["uid"]))
        name, dst = str(req["name"]), self._peer(req, "dst")
        tag = P2P_TAG_BASE + 3 * int(req["seq"])
        info = self.node.call(Op.ATTACH_INFO, job=job.job_id)
        if name not in info["segments"]:
            raise StateError(f"job {job.job_id}: this node has no segment {name!r} (has "
                             f"{sorted(info['segments'])})")
        attached = SegmentStore(Path(info["root"])).attach_state(job, name)
        head = json.dumps(attached.index.to_json()).encode()
        flat = torch.empty(0, dtype=torch.uint8).set_(attached.storage)   # zero-copy
        t0 = time.perf_counter()
        for buf, k in ((torch.tensor([len(head)], dtype=torch.int64), 0),
                       (torch.frombuffer(bytearray(head), dtype=torch.uint8), 1),
                       (flat[:attached.index.size_bytes], 2)):
            self.t.isend(buf, dst, tag + k).wait()
        return {"version": attached.index.version, "bytes": attached.index.size_bytes,
                "elapsed_s": time.perf_counter() - t0}

    def _take(self, req: dict[str, Any]) -> dict[str, Any]:
        """Receive a segment from agent ``src`` and put it into this node's daemon."""
        assert self.t is not None, "connect() first"
        job = JobRef(str(req["job"]), int(req["uid"]))
        tag, src = P2P_TAG_BASE + 3 * int(req["seq"]), self._peer(req, "src")
        t0 = time.perf_counter()
        size = torch.zeros(1, dtype=torch.int64)
        self.t.irecv(size, src, tag).wait()
        if not 0 < int(size) <= MAX_LINE_BYTES:
            raise StateError(f"job {job.job_id}: a segment index of {int(size)} bytes")
        head = torch.zeros(int(size), dtype=torch.uint8)
        self.t.irecv(head, src, tag + 1).wait()
        index = SegmentIndex.loads(bytes(head.numpy()).decode(),
                                   f"{job.job_id}/{req['name']} from {req['src']}")
        buf = torch.zeros(index.size_bytes, dtype=torch.uint8)
        self.t.irecv(buf, src, tag + 2).wait()
        dst = str(req.get("as_name") or req["name"])
        self.node.put_state(job, dst, tensor_views(buf.untyped_storage(), index),
                            index.version, dict(index.extra))
        return {"version": index.version, "bytes": index.size_bytes,
                "elapsed_s": time.perf_counter() - t0}


def _report(report: SyncReport) -> dict[str, Any]:
    return {"version": report.version, "slow_link_bytes": report.slow_link_bytes,
            "full_pieces": report.full_pieces, "delta_pieces": report.delta_pieces,
            "retries": report.retries, "elapsed_s": report.elapsed_s}


def serve(agent: SyncAgent, rfile: IO[bytes], wfile: IO[bytes]) -> None:
    """Answer the runner's requests, one JSON line each, until stdin closes or "stop"."""
    while True:
        line = rfile.readline(MAX_LINE_BYTES)
        if not line:
            return                                  # the runner is gone
        try:
            req = json.loads(line)
            if req.get("op") == "stop":
                _reply(wfile, {"ok": True})
                return
            reply = {"ok": True, **agent.handle(req)}
        except (WeaveError, ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("request failed: %s", exc)
            reply = wire.failed(exc)
        _reply(wfile, reply)


def _reply(wfile: IO[bytes], obj: dict[str, Any]) -> None:
    wfile.write(json.dumps(obj).encode() + b"\n")
    wfile.flush()


def rendezvous(init_method: str, rank: int) -> str:
    """Rank 0 picks a free port for ``tcp://<host>:0``; an explicit one stays."""
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    if rank != 0 or port != "0":
        return init_method
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = AgentSpec.loads(args[0])
    # the control channel is the original stdout; anything else printed goes to stderr
    control = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.basicConfig(level=os.environ.get("WEAVE_LOG", "WARNING"),
                        format=f"%(asctime)s sync-agent {spec.rank} %(levelname)s %(message)s")
    torch.set_num_threads(1)
    init = rendezvous(spec.init_method, spec.rank)
    host = init.removeprefix("tcp://").rpartition(":")[0]
    use_interface_towards(host)
    if spec.rank == 0:
        _reply_line(control, f"RENDEZVOUS {init}")
    watch = start_watch(os.environ, interval_from(None, os.environ), _allocation_gone)
    agent = SyncAgent(spec)
    try:
        agent.connect(init)
        _reply_line(control, f"READY {os.getpid()}")
        serve(agent, sys.stdin.buffer, control)
    except WeaveError as exc:
        print(f"sync agent {spec.rank}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    finally:
        if watch is not None:
            watch.stop()
    sys.stderr.flush()
    os._exit(0)  # skip process-group teardown: a dead peer must not hang the exit


def _allocation_gone(reason: str) -> None:
    """The agent's allocation has ended (its host was cut off and came back: Slurm ends
    nothing there, docs/reliability.md F17); a rank blocked in a collective with peers
    that are gone would wait for ever, so the process ends now (nothing of it is kept)."""
    print(f"sync agent exits: its allocation no longer runs ({reason})", file=sys.stderr,
          flush=True)
    os._exit(3)


def _reply_line(wfile: IO[bytes], text: str) -> None:
    wfile.write(text.encode() + b"\n")
    wfile.flush()


if __name__ == "__main__":
    sys.exit(main())
