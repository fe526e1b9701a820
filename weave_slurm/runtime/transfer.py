"""Moving a member's segments between node daemons (weights and trajectories).

The runner calls one :class:`WeightTransfer`, chosen by ``TransferConfig.kind``
(site config ``[runtime] weight_transfer``):

- ``shm``: the runner attaches the source node's segment zero-copy and puts it on each
  destination through that node's daemon (budget-checked): a direct shared-memory
  handoff, one copy. Only where weaved shares the host with every node of the group
  (the local backend); refused otherwise.
- ``twotier`` (:mod:`weave_slurm.runtime.twotier_transfer`): one sync agent per node, started
  as a step on the node; weights from a training node to rollout nodes go through
  :mod:`weave_slurm.sync` (stage 1: parallel point-to-point streams over the slow link;
  stage 2: relay inside the rollout pool), any other segment (a rollout's
  trajectories) point to point between two agents, and a copy onto the same node by
  that node's daemon (``copy``). A refused (stale/duplicate), corrupt or lost sync
  raises; the runner fails only that member. After a transport failure (a peer died,
  a timeout) the agents are stopped and started afresh on the next sync.
- ``auto`` (default): ``shm`` where weaved shares the host with every node, else
  ``twotier``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from weave_slurm.config.runtime import (
    RUNTIME_DEFAULTS,
    SYNC_MODES,
    WEIGHT_TRANSFERS,
    RuntimeConfig,
    WeightTransferKind,
)
from weave_slurm.errors import ConfigError, StateError
from weave_slurm.node.crc import CRC_KEY, storage_crc32
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import NodeRef

log = logging.getLogger(__name__)

ClientFactory = Callable[[Path], Any]
#: One request to a node daemon (``NodeLink.call``).
NodeCall = Callable[..., dict[str, Any]]


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
