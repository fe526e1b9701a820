"""Moving a member's segments between node daemons (weights and trajectories).

On one host (the LocalBackend, or the local Slurm cluster whose "nodes" share a
host) the executor attaches the source node's segment zero-copy and puts it on the
destination node through that node's daemon (budget-checked): a direct shared-memory
handoff, one copy. Across real hosts the training node would push its weights with
the two-tier sync of :mod:`weave_slurm.sync` instead; that path is not wired here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from weave_slurm.errors import StateError
from weave_slurm.node.index import JobRef
from weave_slurm.node.protocol import Op

log = logging.getLogger(__name__)

ClientFactory = Callable[[Path], Any]


def copy_segment(clients: ClientFactory, src: Path, dsts: Sequence[Path], job: JobRef,
                 name: str) -> tuple[int, int]:
    """Copy segment ``name`` of ``job`` from node ``src`` to each node in ``dsts``.

    Returns ``(version, bytes moved)``; ``StateError`` if the source lacks it.
    """
    from weave_slurm.node.segments import SegmentStore

    info = clients(src).call(Op.ATTACH_INFO, job=job.job_id)
    if name not in info["segments"]:
        raise StateError(f"job {job.job_id}: node {src} has no segment {name!r} "
                         f"(has {sorted(info['segments'])})")
    attached = SegmentStore(Path(info["root"])).attach_state(job, name)
    moved = 0
    for dst in dsts:
        if dst == src:
            continue
        clients(dst).put_state(job, name, attached.tensors, attached.index.version,
                               attached.index.extra)
        moved += attached.index.size_bytes
    log.debug("job %s: %s v%d %s -> %d nodes", job.job_id, name, attached.index.version,
              src, len(dsts))
    return attached.index.version, moved

