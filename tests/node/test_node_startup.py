"""Crash recovery at daemon start: valid state of registered jobs is adopted, the rest cleaned."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from weave_slurm.errors import StateError
from weave_slurm.node.daemon import NodeConfig, NodeDaemon
from weave_slurm.node.index import JobRef
from weave_slurm.node.registry import JobRecord, JobRegistry
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.startup import recover_store

pytestmark = pytest.mark.torch


def _leave_a_mess(root: Path) -> tuple[SegmentStore, JobRef, JobRef]:
    store = SegmentStore(root)
    kept, stale = JobRef("kept", 0), JobRef("stale", 1000)
    store.put_state(kept, "weights", {"w": torch.arange(1024.0)}, version=7)
    store.put_state(kept, "torn", {"w": torch.ones(8)}, version=1)
    store.index_path(kept, "torn").unlink()                       # crash before the index
    (store.job_dir(kept) / "optim.seg.tmp-99999").write_bytes(b"x" * 10)  # crash mid-write
    (store.job_dir(kept) / "orphan.json").write_text("{}")         # index without data
    store.put_state(stale, "weights", {"w": torch.ones(8)}, version=1)
    return store, kept, stale


def test_recover_adopts_valid_and_removes_the_rest(shm_root: Path) -> None:
    store, kept, stale = _leave_a_mess(shm_root)
    report = recover_store(store, {kept})
    assert [(s.job, s.name) for s in report.adopted] == [(kept, "weights")]
    assert not store.job_dir(stale).exists()
    left = sorted(p.name for p in store.job_dir(kept).iterdir())
    assert left == [".lock", "weights.json", "weights.seg"]
    got = store.attach_state(kept, "weights")
    assert got.index.version == 7 and torch.equal(got.tensors["w"], torch.arange(1024.0))


def test_daemon_start_readopts_registered_jobs_and_charges_them(
        shm_root: Path, ckpt_root: Path) -> None:
    store, kept, stale = _leave_a_mess(shm_root)
    registry = JobRegistry(shm_root / "registry.json")
    registry.add(JobRecord(kept, time.time()))
    registry.save()
    daemon = NodeDaemon(NodeConfig(host_mem_gib=0.01, root=shm_root, checkpoint_root=ckpt_root))
    report = daemon.start()
    try:
        assert len(report.adopted) == 1
        assert daemon.budget.report().per_job_bytes == {"kept": 4096}
        assert not store.job_dir(stale).exists()
        second = NodeDaemon(NodeConfig(host_mem_gib=0.01, root=shm_root))
        with pytest.raises(StateError, match="another node daemon"):
            second.start()
    finally:
        daemon.shutdown()
