"""weaved with the group runtime on the LocalBackend: three reference GRPO jobs,
submitted through the socket as weave-sbatch does, run round-robin in one group on
real node daemons and end with their solo weights bit for bit; nothing is left behind."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import spec_text
from tests.harness.solo import run_solo
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.runtime_view import weights_digest
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.node.client import NodeClient
from weave_slurm.node.protocol import Op as NodeOp
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.backend import StepHandle

pytestmark = pytest.mark.torch

ITERATIONS = 2
OPTIONS = {"prompts_per_step": 4, "group_size": 4}


def job_spec(name: str, seed: int, iterations: int = ITERATIONS) -> str:
    head = f"iterations = {iterations}\nseed = {seed}\n"
    opts = "".join(f"{k} = {v}\n" for k, v in OPTIONS.items())
    return head + spec_text(name) + "[options]\n" + opts


def call(sock: Path, op: Op, **args: Any) -> dict[str, Any]:
    with DaemonClient(sock) as client:
        return dict(client.call(op, **args))


@pytest.fixture
def rl_weaved() -> Iterator[tuple[Weaved, Path, Path]]:
    public = Path(tempfile.mkdtemp(prefix="weaved-rt-"))
    public.chmod(0o755)
    shm = Path(tempfile.mkdtemp(prefix="weaved-rt-", dir="/dev/shm"))
    shm.chmod(0o711)
    cfg = DaemonConfig(state_dir=public / "state", tick_s=0.2, shm_root=shm,
                       client_timeout_s=5.0, runtime="rl")
    w = Weaved(cfg)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield w, cfg.socket, shm
    finally:
        for a in w.backend.list_allocations(""):
            for s in w.backend.list_steps(a.alloc_id):
                w.backend.cancel_step(StepHandle(a.alloc_id, s.name, 0))
            w.backend.release(a.alloc_id)
        w.stop()
        t.join(timeout=30)
        shutil.rmtree(public, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


def wait_states(sock: Path, ids: list[int], want: set[str], timeout_s: float,
                seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        rows = call(sock, Op.STATUS, jobs=ids)["jobs"]
        seen.extend(rows)
        if all(r["state"] in want for r in rows):
            return list(rows)
        time.sleep(0.3)
    raise AssertionError(f"jobs did not reach {want}: {rows}")


def test_three_jobs_through_weaved_match_solo(rl_weaved: tuple[Weaved, Path, Path]) -> None:
    w, sock, shm = rl_weaved
    ids = [call(sock, Op.SUBMIT, spec=job_spec(f"grpo-{i}", seed=21 + i),
                source=f"job{i}.toml")["job"] for i in range(3)]
    seen: list[dict[str, Any]] = []
    rows = wait_states(sock, ids, {"COMPLETED", "FAILED"}, 240, seen)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    # one group, phases really ran, and ITER counted up to the requested iterations
    assert len({r["group"] for r in seen if r["group"] is not None}) == 1
    phases = {r["phase"] for r in seen}
    assert phases & {"rollout", "train"}, phases
    assert {r["iter"] for r in rows} == {f"{ITERATIONS}/{ITERATIONS}"}
    for i, job in enumerate(ids):
        live = w.driver.live(job)
        assert live is not None
        solo = run_solo(MemberSpec(str(job), seed=21 + i, steps=ITERATIONS, options=OPTIONS))
        assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"
        assert tuple(live["rewards"]) == solo.rewards
        measured = live["measured"]
        assert len(measured["rollout_s"]) == ITERATIONS
        assert measured["train_state_bytes"] > measured["rollout_state_bytes"] > 0
        assert measured["sync_bytes"]["weights"] > 0
        shown = call(sock, Op.SHOW, kind="job", id=job)
        assert shown["runtime"]["version"] == ITERATIONS
    # the group drained: allocations released, node daemons gone, no job state in shm
    end = time.monotonic() + 30
    while time.monotonic() < end and (w.backend.list_allocations("")
                                      or call(sock, Op.GROUPS)["groups"]):
        time.sleep(0.3)
    assert not w.backend.list_allocations("")
    assert [p for p in shm.rglob("*") if p.name in {str(j) for j in ids}] == []
    assert daemons_gone(w.config.state_dir / "ckpt", 30)


def test_cancel_mid_run_leaves_nothing(rl_weaved: tuple[Weaved, Path, Path]) -> None:
    w, sock, shm = rl_weaved
    keep = call(sock, Op.SUBMIT, spec=job_spec("keep", 1, iterations=2), source="k")["job"]
    gone = call(sock, Op.SUBMIT, spec=job_spec("gone", 2, iterations=50), source="g")["job"]
    end = time.monotonic() + 120
    while time.monotonic() < end:
        live = w.driver.live(gone)
        if live is not None and live["phase"] in ("rollout", "train") and live["version"] >= 1:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"job {gone} never ran: {w.driver.live(gone)}")
    assert call(sock, Op.CANCEL, jobs=[gone])["results"][0]["ok"]
    wait_states(sock, [gone], {"CANCELLED"}, 60, [])
    if call(sock, Op.STATUS, jobs=[keep])["jobs"][0]["state"] == "RUNNING":
        # mid-run: the node daemons serving the group no longer know the cancelled job
        for node_sock in (w.config.state_dir / "nodes").glob("*.sock"):
            with NodeClient(node_sock, timeout_s=5.0) as client:
                jobs = [j["job"] for j in client.call(NodeOp.STATUS)["jobs"]]
            assert str(gone) not in jobs and str(keep) in jobs, (node_sock, jobs)
    rows = wait_states(sock, [keep, gone], {"COMPLETED", "CANCELLED", "FAILED"}, 180, [])
    assert {r["job"]: r["state"] for r in rows} == {keep: "COMPLETED", gone: "CANCELLED"}
    # its segments and checkpoints are gone; once the group drained, so are the daemons
    assert [p for p in shm.rglob("*") if p.name == str(gone)] == []
    ckpt = w.config.state_dir / "ckpt"
    assert [p for p in ckpt.rglob("*") if p.name == str(gone)] == []
    end = time.monotonic() + 30
    while time.monotonic() < end and w.backend.list_allocations(""):
        time.sleep(0.3)
    assert not w.backend.list_allocations("")
    assert daemons_gone(w.config.state_dir / "ckpt", 20)


def test_cancelling_a_groups_last_job_leaves_nothing(
        rl_weaved: tuple[Weaved, Path, Path]) -> None:
    """The cancel empties the group, which drains in the same reconcile tick: the job's
    state on the nodes is dropped before their daemons are stopped."""
    w, sock, shm = rl_weaved
    job = call(sock, Op.SUBMIT, spec=job_spec("last", 3, iterations=50), source="l")["job"]
    end = time.monotonic() + 120
    while (live := w.driver.live(job)) is None or live["version"] < 1:
        assert time.monotonic() < end, f"job {job} never ran: {live}"
        time.sleep(0.2)
    assert call(sock, Op.CANCEL, jobs=[job])["results"][0]["ok"]
    wait_states(sock, [job], {"CANCELLED"}, 60, [])
    end = time.monotonic() + 30
    while time.monotonic() < end and w.backend.list_allocations(""):
        time.sleep(0.3)
    assert daemons_gone(w.config.state_dir / "ckpt", 20)
    assert [p for p in shm.rglob("*") if p.name == str(job)] == []
    assert [p for p in (w.config.state_dir / "ckpt").rglob("*") if p.name == str(job)] == []


def daemons_gone(marker: Path, timeout_s: float) -> bool:
    """No process whose command line names ``marker`` (node daemons, their workers)."""
    end = time.monotonic() + timeout_s
    while True:
        pids = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True,
                              text=True).stdout.split()
        if not pids:
            return True
        if time.monotonic() > end:
            for pid in pids:
                with contextlib.suppress(OSError):
                    print(pid, Path(f"/proc/{pid}/cmdline").read_bytes(),
                          Path(f"/proc/{pid}/stat").read_text().split()[3])
            return False
        time.sleep(0.5)
