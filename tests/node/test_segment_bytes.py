"""The node daemon's byte-level reads (node/segment_bytes.py) give the tensor-level
figures, and ``weave node serve`` serves puts, copies, digests, checkpoints and restores
without ever loading torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.waits import wait_for
from weave_slurm.node import segment_bytes
from weave_slurm.node.crc import CRC_KEY, storage_crc32
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import SegmentStore, weights_digest

pytestmark = pytest.mark.torch
JOB = JobRef("j1", 0)


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(33, 7, generator=g), "b": torch.randn(5, generator=g).bfloat16(),
            "step": torch.tensor(12), "mask": torch.rand(9, generator=g) > 0.5,
            "none": torch.empty(0, 3), "ids": torch.randint(0, 100, (4, 4), generator=g)}


def test_bytes_give_the_tensor_level_crc_and_digest(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    store.ensure_job_dir(JOB)
    store.put_state(JOB, "state", _tensors(), version=3)
    attached = store.attach_state(JOB, "state")
    with store.read_bytes(JOB, "state") as (index, view):
        assert segment_bytes.crc32(view) == storage_crc32(attached.storage)
        assert segment_bytes.digest(view, index) == weights_digest(attached.tensors)
        assert index.version == 3


def test_a_copy_has_its_sources_bytes_layout_and_a_merged_extra(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    store.ensure_job_dir(JOB)
    store.put_state(JOB, "weights", _tensors(), version=4, extra={"seed": 1})
    copy = store.copy_segment(JOB, "weights", "weights.v4", {CRC_KEY: 99})
    src, got = store.attach_state(JOB, "weights"), store.attach_state(JOB, "weights.v4")
    assert copy.version == 4 and got.index.extra == {"seed": 1, CRC_KEY: 99}
    assert got.index.tensors == src.index.tensors
    assert all(torch.equal(got.tensors[k], t) for k, t in src.tensors.items())


def test_node_serve_does_its_work_without_torch(shm_root: Path, tmp_path: Path) -> None:
    sock = shm_root.parent / "node.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "weave_slurm.cli.node", "serve", "--host-mem-gib", "0.05",
         "--root", str(shm_root), "--socket", str(sock), "--checkpoint-root",
         str(tmp_path / "ckpt"), "--checkpoint-interval-s", "0", "--no-resident", "-q"],
        stdin=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, 30, "the node daemon's socket")
        want = _tensors()
        with NodeClient(sock) as c:
            job = c.register("j1")
            c.put_state(job, "weights", want, version=2)
            copied = c.call(Op.COPY, job="j1", name="weights", as_name="weights.v2")
            digest = c.call(Op.DIGEST, job="j1", name="weights.v2")["sha256"]
            c.call(Op.CHECKPOINT, job="j1")
            SegmentStore(shm_root).delete_job(job)   # the node's memory lost, its disk kept
            c.call(Op.RESTORE, job="j1", drop_cache=True)
            back = c.attach(job)
        assert digest == weights_digest(want) == weights_digest(back["weights.v2"].tensors)
        assert copied["crc32"] == back["weights.v2"].index.extra[CRC_KEY]
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in maps and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
