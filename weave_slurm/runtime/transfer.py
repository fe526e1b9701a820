"""Moving a member's segments between node daemons (weights and trajectories).

The runner calls one :class:`WeightTransfer`, chosen by ``TransferConfig.kind``
(site config ``[runtime] weight_transfer``):

- ``shm`` (default): the runner attaches the source node's segment zero-copy and
  puts it on each destination through that node's daemon (budget-checked): a direct
  shared-memory handoff, one copy. Works only where the "nodes" share a host (the
  LocalBackend, the local Slurm cluster).
- ``twotier``: weights from a training node to rollout nodes go through
  :mod:`weave_slurm.sync` (stage 1: parallel point-to-point streams over the slow
  link; stage 2: relay inside the rollout pool), carried by one persistent sync agent
  per node (:mod:`~weave_slurm.sync.agent`), started on first use for the
  group's layout and stopped by :meth:`WeightTransfer.close`. Everything else
  (trajectories rollout -> train, a training node's own weight buffers) still uses the
  shm handoff. A refused (stale/duplicate), corrupt or lost sync raises; the runner
  fails only that member. After a transport failure (a peer died, a timeout) the
  agents are stopped and started afresh on the next sync.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from weave_slurm.config.runtime import (
    RUNTIME_DEFAULTS,
    SYNC_MODES,
    WEIGHT_TRANSFERS,
    RuntimeConfig,
    WeightTransferKind,
)
from weave_slurm.errors import ConfigError, StateError, VersionMismatch, WeaveError
from weave_slurm.hosted.contract import CRC_KEY, storage_crc32
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

ClientFactory = Callable[[Path], Any]


@dataclass(frozen=True)
class TransferConfig:
    """``kind``; for ``twotier``: the sync ``mode`` (full | delta), the transport's
    ``timeout_s`` (every wait), ``start_timeout_s`` for the agents to form their group,
    and the rendezvous host (the first training node's address; loopback on one host)."""

    kind: WeightTransferKind = RUNTIME_DEFAULTS.weight_transfer
    mode: str = RUNTIME_DEFAULTS.sync_mode
    timeout_s: float = RUNTIME_DEFAULTS.sync_timeout_s
    start_timeout_s: float = 120.0
    rendezvous_host: str = "127.0.0.1"

    @classmethod
    def from_site(cls, runtime: RuntimeConfig) -> TransferConfig:
        """The site's ``[runtime]`` table."""
        return cls(runtime.weight_transfer, runtime.sync_mode, runtime.sync_timeout_s)

    def __post_init__(self) -> None:
        if self.kind not in WEIGHT_TRANSFERS:
            raise ConfigError(f"weight_transfer {self.kind!r}: valid: "
                              f"{', '.join(WEIGHT_TRANSFERS)}")
        object.__setattr__(self, "kind", WeightTransferKind(self.kind))
        if self.mode not in SYNC_MODES:
            raise ConfigError(f"sync_mode {self.mode!r}: valid: {', '.join(SYNC_MODES)}")
        if not self.timeout_s > 0 or not self.start_timeout_s > 0:
            raise ConfigError(f"sync_timeout_s {self.timeout_s!r} / start timeout "
                              f"{self.start_timeout_s!r}: must be > 0")


class WeightTransfer(Protocol):
    """What the runner calls to move a segment; ``(version, bytes put on nodes)``."""

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]: ...

    def forget(self, job: JobRef) -> None: ...

    def close(self) -> None: ...


def copy_segment(clients: ClientFactory, src: Path, dsts: Sequence[Path], job: JobRef,
                 name: str, as_name: str | None = None) -> tuple[int, int]:
    """Copy segment ``name`` of ``job`` from node ``src`` to each node in ``dsts``.

    With ``as_name`` it is written under that name (a ring buffer, also onto ``src``
    itself) with the source's CRC32 in its index, and read back and compared before
    this returns. Returns ``(version, bytes moved)``; ``StateError`` on a missing
    source or a copy that does not match it.
    """
    from weave_slurm.node.segments import SegmentStore

    info = clients(src).call(Op.ATTACH_INFO, job=job.job_id)
    if name not in info["segments"]:
        raise StateError(f"job {job.job_id}: node {src} has no segment {name!r} "
                         f"(has {sorted(info['segments'])})")
    attached = SegmentStore(Path(info["root"])).attach_state(job, name)
    version, extra = attached.index.version, dict(attached.index.extra)
    crc = None if as_name is None else storage_crc32(attached.storage)
    if crc is not None:
        extra[CRC_KEY] = crc
    moved = 0
    for dst in dsts:
        if dst == src and as_name is None:
            continue
        client = clients(dst)
        client.put_state(job, as_name or name, attached.tensors, version, extra)
        if as_name is not None:
            dst_info = client.call(Op.ATTACH_INFO, job=job.job_id)
            written = SegmentStore(Path(dst_info["root"])).attach_state(job, as_name)
            if written.index.version != version or storage_crc32(written.storage) != crc:
                raise StateError(f"job {job.job_id}: copy of {name} v{version} to {dst} as "
                                 f"{as_name} does not match its source (CRC32 {crc:#010x})")
        moved += attached.index.size_bytes
    log.debug("job %s: %s v%d %s -> %d nodes", job.job_id, name, version, src, len(dsts))
    return version, moved


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Copy with one torch thread: with intra-op threads on a loaded host, a 2 MiB
    put_state took ~240 ms instead of ~28 ms here (thread contention, not bytes)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ShmTransfer:
    """The shared-memory handoff (``as_name``: into a checked buffer, read back)."""

    def __init__(self, clients: ClientFactory) -> None:
        self.clients = clients

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]:
        paths = [d.socket_path for d in dsts]
        with _one_thread():
            return copy_segment(self.clients, src.socket_path, paths, job, name, as_name)

    def forget(self, job: JobRef) -> None:
        """Nothing to forget: the handoff keeps no versions."""

    def close(self) -> None:
        """Nothing to stop."""


def make_transfer(config: TransferConfig, layout: GroupLayout,
                  clients: ClientFactory) -> WeightTransfer:
    if config.kind is WeightTransferKind.TWOTIER:
        return TwoTierTransfer(layout, clients, config)
    return ShmTransfer(clients)


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
    """Weights train -> rollout through the group's sync agents; the rest over shm."""

    def __init__(self, layout: GroupLayout, clients: ClientFactory,
                 config: TransferConfig) -> None:
        self.layout, self.clients, self.config = layout, clients, config
        self.shm = ShmTransfer(clients)
        self.agents: AgentGroup | None = None
        self.records: deque[SyncRecord] = deque(maxlen=RECORDS_KEPT)

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]:
        remote = [d for d in dsts if d.pool is Pool.ROLLOUT and d != src]
        local = [d for d in dsts if d not in remote]
        version, moved = -1, 0
        if local or src.pool is not Pool.TRAIN or not remote:
            version, moved = self.shm.copy(src, local if src.pool is Pool.TRAIN else dsts,
                                           job, name, as_name)
        if src.pool is Pool.TRAIN and remote:
            version, sent = self._push(src, remote, job, name, as_name)
            moved += sent
        return version, moved

    def _push(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
              as_name: str | None) -> tuple[int, int]:
        agents = self._agents()
        start = time.perf_counter()
        base: dict[str, Any] = {"job": job.job_id, "uid": job.uid, "name": name,
                                "src": src.name, "dsts": [d.name for d in dsts],
                                "crc": as_name is not None}
        train = (Pool.TRAIN, src.name)
        index = dict(agents.request({train: {"op": "prepare", **base}},
                                    self.config.timeout_s)[train]["index"])
        version = base["version"] = int(index["version"])
        requests = {train: {"op": "push", **base}}
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
        self.records.append(SyncRecord(job.job_id, name, version, elapsed,
                                       int(push.get("slow_link_bytes", 0)), node_bytes,
                                       {f"{k[0].value}:{k[1]}": v for k, v in replies.items()}))
        return version, node_bytes

    def _agents(self) -> AgentGroup:
        if self.agents is not None and self.agents.stopped:
            self.agents = None           # stopped after a failure: start afresh
        if self.agents is None:
            self.agents = AgentGroup(self.layout, self.config)
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

    def close(self) -> None:
        if self.agents is not None:
            self.agents.stop()
            self.agents = None


AgentKey = tuple[Pool, str]

#: Errors after which every agent is still in step (the protocol ran to its end, or
#: never started): the agents are kept. Any other error stops them all.
CLEAN_ERRORS = frozenset({"VersionMismatch", "ShardCorrupt", "StateError",
                          "InsufficientResources", "ConfigError"})


@dataclass
class _Agent:
    key: AgentKey
    rank: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    sock: socket.socket | None = None
    buf: bytearray = field(default_factory=bytearray)


class AgentGroup:
    """The sync agents of one group layout: their processes and control channels.

    Ranks: training nodes first, then rollout nodes, in layout order (as
    :func:`~weave_slurm.sync.topology.build_topology` numbers one rank per node). Any
    failure other than a refusal (``VersionMismatch``) stops them all: a process group
    with a dead or timed-out rank is not reused.
    """

    def __init__(self, layout: GroupLayout, config: TransferConfig) -> None:
        self.config = config
        self.world = [(Pool.TRAIN, n) for n in layout.train] + \
            [(Pool.ROLLOUT, n) for n in layout.rollout]
        self.dir = Path(tempfile.mkdtemp(prefix="weave-sync-agents-"))
        self._agents: dict[AgentKey, _Agent] = {}
        self.stopped = False

    def nodes(self) -> list[AgentKey]:
        return list(self._agents)

    def pid(self, key: AgentKey) -> int:
        return int(self._agents[key].proc.pid)

    def pids(self) -> list[int]:
        return [a.proc.pid for a in self._agents.values()]

    def start(self) -> None:
        from weave_slurm.sync.agent import AgentSpec

        with socket.socket() as s:
            s.bind((self.config.rendezvous_host, 0))
            port = s.getsockname()[1]
        world = tuple((pool.value, node.name) for pool, node in self.world)
        init = f"tcp://{self.config.rendezvous_host}:{port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for rank, (pool, node) in enumerate(self.world):
            spec = AgentSpec(rank, world, init, str(node.socket_path), self.config.timeout_s,
                             self.config.mode)
            log_path = self.dir / f"agent{rank}.err"
            with log_path.open("wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "weave_slurm.sync.agent", spec.dumps()],
                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
            self._agents[(pool, node.name)] = _Agent((pool, node.name), rank, proc, log_path)
        deadline = time.monotonic() + self.config.start_timeout_s
        for agent in self._agents.values():
            port_ = self._ready_port(agent, deadline)
            agent.sock = socket.create_connection(("127.0.0.1", port_), timeout=10.0)
            agent.sock.setblocking(False)
        self.request({k: {"op": "ping"} for k in self._agents},
                     max(1.0, deadline - time.monotonic()))
        log.info("sync agents up: %s", ", ".join(f"{k[1]}={a.proc.pid}"
                                                 for k, a in self._agents.items()))

    def _ready_port(self, agent: _Agent, deadline: float) -> int:
        assert agent.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(agent.proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise self._dead(agent, "did not start in "
                                 f"{self.config.start_timeout_s:.0f} s")
        line = agent.proc.stdout.readline().decode(errors="replace").split()
        if len(line) != 2 or line[0] != "READY":
            raise self._dead(agent, "exited before it was ready")
        return int(line[1])

    def request(self, requests: dict[AgentKey, dict[str, Any]], timeout_s: float
                ) -> dict[AgentKey, dict[str, Any]]:
        """Send each agent its request, then wait for every reply (at most ``timeout_s``).

        A refused version raises ``VersionMismatch`` (agents kept); any other failure
        stops every agent and raises ``SyncError`` naming the node and the reason.
        """
        from weave_slurm.sync.errors import SyncError

        try:
            replies = self._exchange(requests, timeout_s)
        except SyncError:
            self.stop(grace_s=1.0)
            raise
        failed = {k: r for k, r in replies.items() if not r.get("ok")}
        if not failed:
            return replies
        broken = [k for k, r in failed.items() if r.get("error") not in CLEAN_ERRORS]
        refusals = [k for k, r in failed.items() if r.get("error") == "VersionMismatch"]
        first_key = (broken or refusals or list(failed))[0]
        first = failed[first_key]
        why = (f"sync agent on {first_key[1]}: {first.get('error')}: {first.get('message')}"
               + (f" (and {len(failed) - 1} more agents)" if len(failed) > 1 else ""))
        if broken:
            self.stop(grace_s=1.0)
            raise SyncError(why)
        if refusals:
            raise VersionMismatch(why)
        raise StateError(why)

    def _exchange(self, requests: dict[AgentKey, dict[str, Any]], timeout_s: float
                  ) -> dict[AgentKey, dict[str, Any]]:
        from weave_slurm.sync.errors import SyncError

        deadline = time.monotonic() + timeout_s
        for key, req in requests.items():
            agent = self._agents[key]
            assert agent.sock is not None
            try:
                agent.sock.setblocking(True)
                agent.sock.sendall(json.dumps(req).encode() + b"\n")
                agent.sock.setblocking(False)
            except OSError as exc:
                raise self._dead(agent, f"control channel: {exc}") from exc
        replies: dict[AgentKey, dict[str, Any]] = {}
        with selectors.DefaultSelector() as sel:
            for key in requests:
                sock = self._agents[key].sock
                assert sock is not None
                sel.register(sock, selectors.EVENT_READ, key)
            while len(replies) < len(requests):
                left = deadline - time.monotonic()
                events = sel.select(max(0.0, left)) if left > 0 else []
                if not events:
                    late = [k[1] for k in requests if k not in replies]
                    raise SyncError(f"sync agents on {', '.join(late)}: no reply within "
                                    f"{timeout_s:.0f} s")
                for ev, _ in events:
                    agent = self._agents[ev.data]
                    reply = self._read_reply(agent)
                    if reply is not None:
                        replies[agent.key] = reply
                        sel.unregister(ev.fileobj)
                    if reply is not None and not reply.get("ok") \
                            and reply.get("error") not in CLEAN_ERRORS:
                        return replies      # the world is broken: do not wait for the rest
        return replies

    def _read_reply(self, agent: _Agent) -> dict[str, Any] | None:
        assert agent.sock is not None
        try:
            data = agent.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._dead(agent, f"control channel: {exc}") from exc
        if not data:
            raise self._dead(agent, "closed its control channel")
        agent.buf.extend(data)
        if b"\n" not in agent.buf:
            return None
        line, _, rest = bytes(agent.buf).partition(b"\n")
        agent.buf[:] = rest
        return dict(json.loads(line))

    def _dead(self, agent: _Agent, what: str) -> WeaveError:
        from weave_slurm.sync.errors import SyncError

        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(timeout=0.2)
        code = agent.proc.poll()
        tail = ""
        with contextlib.suppress(OSError):
            lines = agent.log_path.read_text(errors="replace").strip().splitlines()
            tail = f": {lines[-1]}" if lines else ""
        state = "running" if code is None else f"exit {code}"
        return SyncError(f"sync agent on {agent.key[1]} (pid {agent.proc.pid}, {state}) "
                         f"{what}{tail}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask every agent to stop, then kill what is left; remove the log directory."""
        for agent in self._agents.values():
            if agent.sock is not None and agent.proc.poll() is None:
                with contextlib.suppress(OSError):
                    agent.sock.setblocking(True)
                    agent.sock.settimeout(1.0)
                    agent.sock.sendall(b'{"op": "stop"}\n')
        deadline = time.monotonic() + grace_s
        for agent in self._agents.values():
            try:
                agent.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()
            if agent.sock is not None:
                agent.sock.close()
            if agent.proc.stdout is not None:
                agent.proc.stdout.close()
        self._agents.clear()
        self.stopped = True
        shutil.rmtree(self.dir, ignore_errors=True)
