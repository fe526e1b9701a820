"""What ``weave node serve`` does once its allocation watch says the job has ended
(docs/reliability.md, F17): every job's segments go, since nothing reads them again
(weaved re-admits the members elsewhere from their checkpoints) and the jobs are
forgotten, so nothing of them stays in /dev/shm; the checkpoints on the shared file
system stay."""

from __future__ import annotations

import os

import pytest
import torch

from weave_slurm.errors import StateError
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.ending import end_allocation
from weave_slurm.node.leaving import leave
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op


def test_an_ended_allocations_segments_are_removed_and_its_checkpoints_kept(
        node: NodeDaemon) -> None:
    with NodeClient(node.config.socket) as c:
        jobs = [c.register(name) for name in ("j1", "j2")]
        for job in jobs:
            c.put_state(job, "weights", {"w": torch.ones(4)}, version=1)
        c.call(Op.CHECKPOINT, job="j1")
    assert len(node.store.list_segments()) == 2
    end_allocation(node, "job 7 is NODE_FAIL")
    assert node.store.list_jobs() == [] and node.store.used_bytes() == 0
    assert node.registry.jobs() == []   # forgotten: the shutdown leaves no file of them
    node.shutdown()
    assert not node.config.root.exists(), sorted(node.config.root.rglob("*"))
    assert [node.ckpt.read(p).versions for p in node.ckpt.checkpoints(jobs[0])] == \
        [{"weights": 1}]


def test_a_node_weaved_gives_back_ends_its_daemon_when_weaved_asks(
        node: NodeDaemon) -> None:
    """``Op.LEAVE`` (daemon/allocplan.py "Spare nodes"): weaved asks before Slurm's
    shrink would SIGKILL the daemon's task; the daemon ends itself as on the end of its
    allocation (``on_leave``, set by ``weave node serve``)."""
    asked: list[str] = []
    with NodeClient(node.config.socket) as c:
        with pytest.raises(StateError, match="does not run as its own process"):
            c.call(Op.LEAVE)
        node.on_leave = asked.append
        assert c.call(Op.LEAVE) == {"leaving": True}
    assert asked == ["weaved gave this node back to Slurm"]
    with pytest.raises(StateError, match="only weaved"):
        leave(node.on_leave, os.geteuid() + 1 if os.geteuid() else 4242)
