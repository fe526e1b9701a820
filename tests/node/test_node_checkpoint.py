"""Checkpoints: atomic, private, the newest N kept, restored byte for byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from weave_slurm.errors import NoCheckpoint, StateError
from weave_slurm.node.checkpoint import CheckpointStore
from weave_slurm.node.index import JobRef
from weave_slurm.node.segments import SegmentStore

pytestmark = pytest.mark.torch
NOBODY = 65534


def test_save_restore_round_trip_and_keep_last(shm_root: Path, ckpt_root: Path) -> None:
    store = SegmentStore(shm_root)
    ckpt = CheckpointStore(ckpt_root, keep_last=2)
    job = JobRef("j1", NOBODY)
    w = torch.randn(256, 64)
    store.put_state(job, "weights", {"w": w}, version=1, extra={"loader_pos": 5})
    store.put_state(job, "optim", {"m": torch.zeros(10), "step": torch.tensor(3)}, version=1)
    for v in (2, 3, 4):
        store.update_state(job, "weights", {"w": w + v}, version=v)
        info = ckpt.save(store, job)
    assert info.versions == {"optim": 1, "weights": 4} and info.seq == 3
    assert [p.name for p in ckpt.checkpoints(job)] == ["ckpt-000002", "ckpt-000003"]
    assert not [p for p in ckpt.job_dir(job).iterdir() if p.name.startswith(".tmp")]
    for path in [info.path, *info.path.iterdir()]:
        st = os.stat(path)
        want = 0o700 if path.is_dir() else 0o600
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, want), path

    store.delete_job(job)
    restored = ckpt.restore(store, job, drop_cache=True)
    assert restored.versions == {"optim": 1, "weights": 4} and restored.elapsed_s >= 0
    got = store.attach_state(job, "weights")
    assert got.index.version == 4 and got.index.extra == {"loader_pos": 5}
    assert torch.equal(got.tensors["w"], w + 4)
    assert int(store.attach_state(job, "optim").tensors["step"]) == 3


def test_restore_without_checkpoint_is_a_state_error(shm_root: Path, ckpt_root: Path) -> None:
    with pytest.raises(StateError, match="no checkpoint"):
        CheckpointStore(ckpt_root).restore(SegmentStore(shm_root), JobRef("j9", 0))


def test_torn_segment_is_skipped(shm_root: Path, ckpt_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    store.put_state(job, "good", {"w": torch.ones(4)}, version=1)
    store.put_state(job, "torn", {"w": torch.ones(4)}, version=1)
    store.index_path(job, "torn").unlink()
    info = CheckpointStore(ckpt_root).save(store, job)
    assert info.versions == {"good": 1}


def test_a_cold_process_reads_a_checkpoint_segment_without_shm(
        shm_root: Path, ckpt_root: Path) -> None:
    from weave_slurm.node.checkpoint import read_segment

    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    w, step = torch.randn(64, 33), torch.tensor(9)
    store.put_state(job, "state", {"w": w, "step": step}, version=6)
    path = CheckpointStore(ckpt_root).save(store, job).path
    store.delete_job(job)   # nothing left in shared memory: the read is from disk only
    index, got = read_segment(path, "state")
    assert index.version == 6 and torch.equal(got["w"], w) and torch.equal(got["step"], step)
    got["w"].add_(1.0)      # private memory: the checkpoint is not written through
    assert torch.equal(read_segment(path, "state")[1]["w"], w)
    with pytest.raises(StateError, match=r"has no segment 'weights' \(has: state\)"):
        read_segment(path, "weights")


def test_adopt_takes_the_newest_checkpoint_of_a_lost_nodes_root(
        shm_root: Path, ckpt_root: Path) -> None:
    store = SegmentStore(shm_root)
    lost, new = CheckpointStore(ckpt_root / "h800-0"), CheckpointStore(ckpt_root / "h800-1")
    job = JobRef("j1", NOBODY if os.geteuid() == 0 else os.geteuid())
    w = torch.randn(64, 8)
    store.put_state(job, "weights", {"w": w}, version=1)
    new.save(store, job)                  # an older checkpoint already on the new node
    for v in (2, 3):
        store.update_state(job, "weights", {"w": w + v}, version=v)
        lost.save(store, job)
    store.delete_job(job)

    info = new.adopt(lost, job)
    assert info.seq == 2 and info.versions == {"weights": 3}
    assert new.latest(job) == info.path and not lost.job_dir(job).exists()
    for path in [info.path, *info.path.iterdir()]:
        st = os.stat(path)
        want = 0o700 if path.is_dir() else 0o600
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (job.uid, want), path
    new.restore(store, job)
    assert torch.equal(store.attach_state(job, "weights").tensors["w"], w + 3)
    with pytest.raises(StateError, match="no checkpoint"):   # nothing left to adopt
        new.adopt(lost, job)


def test_latest_of_a_version_is_the_newest_checkpoint_of_that_state(
        shm_root: Path, ckpt_root: Path) -> None:
    store = SegmentStore(shm_root)
    ckpt = CheckpointStore(ckpt_root, keep_last=4)
    job = JobRef("j1", 0)
    store.put_state(job, "state", {"w": torch.zeros(4)}, version=1)
    store.put_state(job, "weights", {"w": torch.zeros(4)}, version=1)
    ckpt.save(store, job)                                        # ckpt-000001: state v1
    store.update_state(job, "state", {"w": torch.ones(4)}, version=2)
    ckpt.save(store, job)                                        # ckpt-000002: state v2
    store.update_state(job, "weights", {"w": torch.ones(4)}, version=5)
    ckpt.save(store, job)                                        # ckpt-000003: state v2 again
    store.update_state(job, "state", {"w": torch.full((4,), 3.0)}, version=3)
    ckpt.save(store, job)                                        # ckpt-000004: state v3
    names = {v: ckpt.latest(job, version=v).name for v in (1, 2, 3)}
    assert names == {1: "ckpt-000001", 2: "ckpt-000003", 3: "ckpt-000004"}
    assert ckpt.latest(job).name == "ckpt-000004"
    assert ckpt.read(ckpt.latest(job, version=2)).versions == {"state": 2, "weights": 5}
    restored = ckpt.restore(store, job, ckpt.latest(job, version=1))
    assert restored.versions == {"state": 1, "weights": 1}
    assert torch.equal(store.attach_state(job, "state").tensors["w"], torch.zeros(4))


def test_latest_of_a_version_it_lacks_is_no_checkpoint_naming_it(
        shm_root: Path, ckpt_root: Path) -> None:
    store = SegmentStore(shm_root)
    ckpt = CheckpointStore(ckpt_root)
    job = JobRef("j1.r1", 0)
    store.put_state(job, "weights", {"w": torch.ones(4)}, version=2)
    ckpt.save(store, job)                       # no ``state`` segment: of no version
    store.put_state(job, "state", {"w": torch.ones(4)}, version=2)
    ckpt.save(store, job)
    assert ckpt.latest(job, version=2).name == "ckpt-000002"
    with pytest.raises(NoCheckpoint) as err:
        ckpt.latest(job, version=3)
    assert str(err.value) == (f"job 'j1.r1' has no checkpoint of state version 3 under "
                              f"{ckpt.job_dir(job)}")
    with pytest.raises(NoCheckpoint, match=r"^job 'j9' has no checkpoint of state version 0 "):
        ckpt.latest(JobRef("j9", 0), version=0)
