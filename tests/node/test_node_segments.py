"""The shared-memory door: layout, zero-copy attach across processes, isolation, torn writes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.node.index import JobRef, SegmentIndex
from weave_slurm.node.segments import SegmentStore

pytestmark = pytest.mark.torch

NOBODY = 65534
STRANGER = 54321


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.arange(5, dtype=torch.int64),
            "h": torch.ones(3, 3, dtype=torch.bfloat16), "mask": torch.tensor([True, False]),
            "rng": torch.get_rng_state()}


def test_put_attach_round_trip_keeps_values_dtypes_and_extra(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    state = _state()
    store.put_state(job, "weights", state, version=3, extra={"loader_pos": 17},
                    checksum=True)
    got = store.attach_state(job, "weights", verify=True)
    assert got.index.version == 3 and got.index.extra == {"loader_pos": 17}
    for key, value in state.items():
        assert got.tensors[key].dtype == value.dtype
        assert torch.equal(got.tensors[key], value), key
    assert all(e.offset_bytes % 64 == 0 for e in got.index.tensors)


def test_files_are_private_to_the_owner(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", NOBODY)
    store.put_state(job, "weights", _state(), version=1)
    jdir = store.job_dir(job)
    for path in (jdir.parent, jdir):
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700), path
    for path in (store.seg_path(job, "weights"), store.index_path(job, "weights")):
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o600), path


def test_other_uid_gets_permission_error_owner_attaches(
        shm_root: Path, run_as: Callable[[int, Callable[[], str]], str]) -> None:
    store = SegmentStore(shm_root)
    state = _state()
    store.put_state(JobRef("j1", NOBODY), "weights", state, version=1)

    def attach() -> str:
        got = SegmentStore(shm_root).attach_state(JobRef("j1", NOBODY), "weights")
        return f"sum {float(got.tensors['w'].sum())}"

    def open_raw() -> str:
        os.open(store.seg_path(JobRef("j1", NOBODY), "weights"), os.O_RDONLY)
        return "opened"

    assert run_as(NOBODY, attach) == f"sum {float(state['w'].sum())}"
    assert run_as(STRANGER, attach).startswith("PermissionError")
    assert run_as(STRANGER, open_raw).startswith("PermissionError")


_PEER = """
import sys, time
from pathlib import Path
from weave_slurm.node.index import JobRef
from weave_slurm.node.segments import SegmentStore
got = SegmentStore(Path(sys.argv[1])).attach_state(JobRef("j1", 0), "weights")
w = got.tensors["w"]
print("seen", float(w[0, 0]), flush=True)
w[0, 1] = 42.0
print("wrote", flush=True)
sys.stdin.readline()                      # parent has written w[0, 2]
print("parent", float(w[0, 2]), flush=True)
"""


def test_second_process_sees_same_bytes_and_writes_go_both_ways(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    w = torch.zeros(4, 4)
    w[0, 0] = 3.5
    store.put_state(job, "weights", {"w": w}, version=1)
    mine = store.attach_state(job, "weights").tensors["w"]
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(shm_root)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert peer.stdout is not None and peer.stdin is not None
    try:
        assert peer.stdout.readline().split() == ["seen", "3.5"]
        assert peer.stdout.readline().strip() == "wrote"
        assert float(mine[0, 1]) == 42.0          # peer -> us
        mine[0, 2] = -7.0
        peer.stdin.write("go\n")
        peer.stdin.flush()
        assert peer.stdout.readline().split() == ["parent", "-7.0"]  # us -> peer
    finally:
        peer.kill()
        peer.wait()
    # the peer's exit did not unlink anything
    assert float(store.attach_state(job, "weights").tensors["w"][0, 1]) == 42.0


def test_update_in_place_is_seen_by_existing_attachments(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    store.put_state(job, "weights", {"w": torch.zeros(8)}, version=1)
    held = store.attach_state(job, "weights")
    new = store.update_state(job, "weights", {"w": torch.full((8,), 2.0)}, version=2,
                             extra={"step": 2})
    assert new.version == 2 and new.extra == {"step": 2}
    assert torch.equal(held.tensors["w"], torch.full((8,), 2.0))
    with pytest.raises(StateError, match="use put_state"):
        store.update_state(job, "weights", {"w": torch.zeros(9)}, version=3)


def test_torn_segments_are_detected(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job = JobRef("j1", 0)
    for name in ("ok", "noindex", "half", "short"):
        store.put_state(job, name, {"w": torch.ones(1024)}, version=1)
    store.index_path(job, "noindex").unlink()
    half = store.read_index(job, "half")
    store._write_index(job, SegmentIndex(**{**half.__dict__, "complete": False}))
    os.truncate(store.seg_path(job, "short"), 100)
    problems = {s.name: s.problem for s in store.list_segments(job)}
    assert problems["ok"] is None
    assert "no index" in str(problems["noindex"])
    assert "did not finish" in str(problems["half"])
    assert "index says" in str(problems["short"])
    with pytest.raises(StateError, match="torn"):
        store.attach_state(job, "half")
    with pytest.raises(StateError, match="torn"):
        store.attach_state(job, "short")


def test_delete_job_removes_everything(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    job, other = JobRef("j1", 0), JobRef("j2", 0)
    store.put_state(job, "a", {"w": torch.ones(4)}, version=1)
    store.put_state(job, "b", {"w": torch.ones(4)}, version=1)
    store.put_state(other, "a", {"w": torch.ones(4)}, version=1)
    store.delete_job(job)
    assert not store.job_dir(job).exists()
    assert [s.job for s in store.list_segments()] == [other]


def test_bad_names_are_refused(shm_root: Path) -> None:
    store = SegmentStore(shm_root)
    with pytest.raises(ConfigError, match="job id"):
        JobRef("../etc", 0)
    with pytest.raises(ConfigError, match="segment name"):
        store.put_state(JobRef("j1", 0), "a/b", {"w": torch.ones(1)}, version=1)
