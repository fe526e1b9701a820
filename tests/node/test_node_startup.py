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
        second = NodeDaemon(NodeConfig(host_mem_gib=0.01, root=shm_root, root_wait_s=0.3))
        with pytest.raises(StateError, match="another node daemon"):
            second.start()
    finally:
        daemon.shutdown()


def test_a_clean_stop_with_no_job_registered_leaves_nothing_in_shm(
        shm_root: Path, ckpt_root: Path) -> None:
    """The registry, its locks and the empty job and uid directories go with the root
    (they stayed after every job had ended); a registered job's root is kept whole."""
    from weave_slurm.node.startup import remove_empty_root

    daemon = NodeDaemon(NodeConfig(host_mem_gib=0.01, root=shm_root, checkpoint_root=ckpt_root))
    daemon.start()
    store = SegmentStore(shm_root)
    gone = JobRef("gone", 0)
    store.put_state(gone, "weights", {"w": torch.ones(8)}, version=1)
    store.delete_segment(gone, "weights")    # the job ended: its directory and lock stay
    assert (shm_root / "registry.json").exists() or (shm_root / ".daemon.lock").exists()
    daemon.shutdown()
    assert not shm_root.exists()

    kept = NodeDaemon(NodeConfig(host_mem_gib=0.01, root=shm_root, checkpoint_root=ckpt_root))
    kept.start()
    job = JobRef("warm", 0)
    SegmentStore(shm_root).put_state(job, "weights", {"w": torch.ones(8)}, version=1)
    kept.registry.add(JobRecord(job, time.time()))
    kept.registry.save()
    kept.shutdown()
    assert (SegmentStore(shm_root).job_dir(job) / "weights.seg").exists()  # warm: kept
    stray = shm_root / "0" / "stray"
    stray.mkdir(parents=True)
    (stray / "x.seg").write_bytes(b"x")
    (shm_root / "registry.json").unlink()
    assert not remove_empty_root(shm_root) and (stray / "x.seg").exists()   # never data
