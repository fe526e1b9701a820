"""put_state racing drop: after drop returns nothing of the job exists or comes back.

The writer is held at a chosen point of its put (by threading.Events, no sleeps) while
another connection drops the job; then it is let go and must fail with a clear error.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from weave_slurm.errors import StateError
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.index import JobRef, SegmentIndex
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import SegmentStore
from weave_slurm.node.staging import StagingArea
from weave_slurm.node.startup import recover_store

pytestmark = pytest.mark.torch
NOBODY = 65534
WAIT_S = 30.0


class _Gate:
    """The writer calls ``hold()``: it signals ``reached`` and waits for ``go``."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.reached.set()
        assert self.go.wait(WAIT_S), "the test never let the writer go"


class _PausingState(Mapping[str, torch.Tensor]):
    """Tensors whose iteration stops at the gate after the first one (mid-write)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], gate: _Gate) -> None:
        self._tensors, self._gate = tensors, gate

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._tensors[key]

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        for i, key in enumerate(self._tensors):
            if i == 1:
                self._gate.hold()
            yield key


class _GatedClient(NodeClient):
    """A client whose staged write stops at ``where``: before_open, mid_write or
    before_commit (after all bytes and the index are written)."""

    def __init__(self, path: Path, where: str, gate: _Gate) -> None:
        super().__init__(path)
        self.where, self.gate = where, gate
        self.staged: dict[str, Any] = {}

    def _write_staged(self, reply: Mapping[str, Any], index: SegmentIndex,
                      tensors: Mapping[str, torch.Tensor]) -> None:
        self.staged = dict(reply)
        if self.where == "before_open":
            self.gate.hold()
        if self.where == "mid_write":
            tensors = _PausingState(tensors, self.gate)
        super()._write_staged(reply, index, tensors)
        if self.where == "before_commit":
            self.gate.hold()


def _leftovers(root: Path, job_id: str) -> list[Path]:
    return [p for p in root.rglob("*") if job_id in p.name or
            (p.parent.name == job_id)]


@pytest.mark.parametrize("where", ["before_open", "mid_write", "before_commit"])
def test_drop_during_put_leaves_nothing_and_the_writer_is_told(
        node: NodeDaemon, where: str) -> None:
    gate = _Gate()
    state = {"a": torch.ones(256, 256), "b": torch.full((512, 256), 2.0)}
    with NodeClient(node.config.socket) as admin:
        job = admin.register("j1")
        keep = admin.register("j2")
        admin.put_state(keep, "weights", {"w": torch.ones(64)}, version=1)
        admin.put_state(job, "weights", {"w": torch.zeros(16)}, version=1)  # an old one
        outcome: list[BaseException | SegmentIndex] = []

        def writer() -> None:
            with _GatedClient(node.config.socket, where, gate) as c:
                try:
                    outcome.append(c.put_state(job, "weights", state, version=2))
                except BaseException as exc:  # the assertion below names it
                    outcome.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        assert gate.reached.wait(WAIT_S), f"writer never reached {where}: {outcome}"
        assert list(node.store.job_dir(job).glob("weights.seg.stage-*")), "nothing staged"
        assert admin.call(Op.DROP, job="j1")["dropped"]
        assert not node.store.job_dir(job).exists()
        gate.go.set()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        status = admin.call(Op.STATUS)

    assert len(outcome) == 1 and isinstance(outcome[0], StateError), outcome
    message = str(outcome[0])
    assert "j1/weights" in message and ("dropped" in message), message
    # nothing of j1 exists, nor came back; j2 is untouched
    assert _leftovers(node.config.root, "j1") == []
    assert not node.store.job_dir(job).exists()
    assert [j["job"] for j in status["jobs"]] == ["j2"]
    assert status["memory"]["per_job_bytes"] == {"j2": 4096}
    assert torch.equal(node.store.attach_state(keep, "weights").tensors["w"], torch.ones(64))


def test_a_newer_put_replaces_an_open_one(node: NodeDaemon) -> None:
    """The older writer's commit is refused; the budget holds the newer size only."""
    gate = _Gate()
    outcome: list[BaseException | SegmentIndex] = []
    with NodeClient(node.config.socket) as admin:
        job = admin.register("j1")

        def writer() -> None:
            with _GatedClient(node.config.socket, "before_commit", gate) as c:
                try:
                    outcome.append(c.put_state(job, "weights", {"w": torch.ones(4096)}, 1))
                except BaseException as exc:
                    outcome.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        assert gate.reached.wait(WAIT_S)
        newer = admin.put_state(job, "weights", {"w": torch.full((8,), 3.0)}, version=2)
        gate.go.set()
        thread.join(WAIT_S)
        status = admin.call(Op.STATUS)
    assert isinstance(outcome[0], StateError), outcome
    assert "replaced it" in str(outcome[0])
    assert list(node.store.job_dir(job).glob("*.stage-*")) == []
    got = node.store.attach_state(job, "weights")
    assert got.index.version == newer.version == 2
    assert torch.equal(got.tensors["w"], torch.full((8,), 3.0))
    assert status["memory"]["per_job_bytes"] == {"j1": 4096}


def test_a_failed_write_is_aborted_and_its_charge_undone(node: NodeDaemon) -> None:
    class Broken(NodeClient):
        def _write_staged(self, reply: Mapping[str, Any], index: SegmentIndex,
                          tensors: Mapping[str, torch.Tensor]) -> None:
            raise RuntimeError("writer crashed")

    with NodeClient(node.config.socket) as c, Broken(node.config.socket) as b:
        job = c.register("j1")
        c.put_state(job, "weights", {"w": torch.ones(2048)}, version=1)   # 8 KiB
        with pytest.raises(RuntimeError, match="writer crashed"):
            b.put_state(job, "weights", {"w": torch.ones(4 * 2**20 // 4)}, version=2)
        status = c.call(Op.STATUS)
    assert status["memory"]["per_job_bytes"] == {"j1": 8192}
    assert list(node.store.job_dir(job).glob("*.stage-*")) == []
    assert node.store.attach_state(job, "weights").index.version == 1


def test_committed_files_belong_to_the_job_uid_with_mode_0600(
        node: NodeDaemon, run_as: Callable[[int, Callable[[], str]], str]) -> None:
    with NodeClient(node.config.socket) as c:
        job = c.register("j1", uid=NOBODY)

    def put() -> str:
        with NodeClient(node.config.socket) as mine:
            mine.put_state(job, "weights", {"w": torch.arange(32.0)}, version=4)
        return "ok"

    assert run_as(NOBODY, put) == "ok"
    for path in (node.store.seg_path(job, "weights"), node.store.index_path(job, "weights")):
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o600), path
    got = node.store.attach_state(job, "weights")
    assert torch.equal(got.tensors["w"], torch.arange(32.0)) and got.index.version == 4


def test_recovery_removes_stale_stage_files(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    store.put_state(job, "weights", {"w": torch.ones(4)}, version=1)
    res = StagingArea(store).reserve(job, "weights", 4096, prev_bytes=4096)
    assert res.seg_path.exists() and res.index_path.exists()
    report = recover_store(store, {job})
    assert {res.seg_path, res.index_path} <= set(report.removed)
    assert not res.seg_path.exists() and not res.index_path.exists()
    assert [s.name for s in report.adopted] == ["weights"]


def test_a_staged_write_never_creates_a_missing_file(shm_root: Path) -> None:
    from weave_slurm.node.staging import write_staged

    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    store.ensure_job_dir(job)
    res = StagingArea(store).reserve(job, "weights", 4096, prev_bytes=0)
    store.delete_job(job)
    index = SegmentIndex(name="weights", version=1, size_bytes=4096, align_bytes=64,
                         tensors=(), created_s=0.0, updated_s=0.0)
    with pytest.raises(FileNotFoundError):
        write_staged(res.seg_path, res.index_path, index, {})
    assert not store.job_dir(job).exists()
    with pytest.raises(StateError, match="dropped"), store.job_lock(job):
        pass
    assert not store.job_dir(job).exists()
