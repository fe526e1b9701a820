"""Resident workers: forked by the zygote, kept alive between phases, replaced on death."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness.waits import wait_for
from weave_slurm.errors import NodeUnavailable, SegmentMissing
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.resident import AttachCache
from weave_slurm.node.segments import JobRef, SegmentStore
from weave_slurm.node.zygotes import Interpreter

pytestmark = pytest.mark.torch
NOBODY = 65534

ENTRY = """
import json, os, time
import torch

def report(ctx):
    w = ctx.state["weights"].tensors["w"]
    y = w @ torch.ones(w.shape[1])               # first useful work on the attached weights
    return {"pid": os.getpid(), "uid": os.getuid(), "euid": os.geteuid(),
            "groups": os.getgroups(), "phase": ctx.phase, "args": list(ctx.args),
            "sum": float(y.sum()), "version": ctx.state["weights"].index.version,
            "segments": json.loads(os.environ["WEAVE_SEGMENTS"])}

def hang(ctx):
    if ctx.args:                                  # tell the test the entry runs
        open(ctx.args[0], "w").close()
    time.sleep(600)

def peek(ctx):
    try:
        open(ctx.args[0], "rb").close()
        return "opened"
    except PermissionError:
        return "PermissionError"
"""


@pytest.fixture
def entry(shm_root: Path) -> str:
    """The entry module, readable by every uid (its parent directory is 0711)."""
    path = shm_root.parent / "entry.py"
    path.write_text(ENTRY)
    path.chmod(0o644)
    return str(path)


def _wait(c: NodeClient, job: str, timeout_s: float = 60.0) -> dict[str, Any]:
    return dict(wait_for(lambda: c.call(Op.PHASE, job=job)["worker"], timeout_s,
                         f"job {job}'s phase to end", interval_s=0.01,
                         until=lambda worker: worker["state"] != "running"))


def _run(c: NodeClient, job: str, entry: str, fn: str, *args: str) -> dict[str, Any]:
    reply = c.call(Op.ACTIVATE, job=job, phase="train", entry=f"{entry}:{fn}", args=list(args))
    assert reply["resident"] and reply["state"] == "running"
    return _wait(c, job)


def _owner() -> int:
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def test_a_resident_worker_serves_two_activations_without_restarting(
        resident_node: NodeDaemon, entry: str) -> None:
    with NodeClient(resident_node.config.socket) as c:
        job = c.register("j1", uid=_owner())
        c.put_state(job, "weights", {"w": torch.ones(8, 4)}, version=1)
        first = _run(c, "j1", entry, "report", "a")
        c.put_state(job, "weights", {"w": torch.full((8, 4), 2.0)}, version=2)  # new file
        second = _run(c, "j1", entry, "report", "b")
        status = c.call(Op.STATUS)["jobs"][0]["resident"]
    assert first["state"] == second["state"] == "exited", (first, second)
    assert first["result"]["pid"] == second["result"]["pid"] == status["pid"]
    assert (first["result"]["sum"], second["result"]["sum"]) == (32.0, 64.0)
    assert (first["result"]["version"], second["result"]["version"]) == (1, 2)
    assert second["result"]["args"] == ["b"] and second["activation"] == 2
    assert status["restarts"] == 0 and status["activations"] == 2


def test_a_killed_resident_worker_is_replaced_and_the_next_activation_works(
        resident_node: NodeDaemon, entry: str) -> None:
    w = torch.randn(16, 4)
    with NodeClient(resident_node.config.socket) as c:
        job = c.register("j1", uid=_owner())
        c.put_state(job, "weights", {"w": w}, version=3)
        running = c.call(Op.ACTIVATE, job="j1", phase="rollout", entry=f"{entry}:hang")
        os.kill(running["pid"], signal.SIGKILL)
        dead = _wait(c, "j1")
        assert dead["state"] == "killed" and dead["pid"] == running["pid"], dead
        after = _run(c, "j1", entry, "report")
        status = c.call(Op.STATUS)["jobs"][0]
        attached = c.attach(job)["weights"] if os.geteuid() == _owner() else None
    assert after["state"] == "exited", after
    assert after["result"]["pid"] != running["pid"]
    assert after["result"]["version"] == 3
    assert after["result"]["sum"] == pytest.approx(float((w @ torch.ones(4)).sum()), rel=1e-5)
    assert status["resident"]["restarts"] == 1
    assert status["segments"]["weights"]["version"] == 3
    if attached is not None:
        assert torch.equal(attached.tensors["w"], w)


def test_a_killed_zygote_is_started_again_and_its_jobs_get_new_workers(
        resident_node: NodeDaemon, entry: str) -> None:
    pool = resident_node.pool
    assert pool is not None
    with NodeClient(resident_node.config.socket) as c:
        job = c.register("j1", uid=_owner())
        c.put_state(job, "weights", {"w": torch.ones(8, 4)}, version=1)
        before = _run(c, "j1", entry, "report")
        running = c.call(Op.ACTIVATE, job="j1", phase="rollout", entry=f"{entry}:hang")
        old = pool.zygote_pids()[Interpreter()]
        assert old is not None
        os.kill(old, signal.SIGKILL)      # its workers get SIGKILL too (PDEATHSIG)
        dead = _wait(c, "j1")
        assert dead["state"] == "killed" and dead["pid"] == running["pid"], dead
        after = _run(c, "j1", entry, "report")   # waits for the new zygote and worker
    assert after["state"] == "exited", after
    assert after["result"]["pid"] not in (before["result"]["pid"], running["pid"])
    assert pool.zygote_pids()[Interpreter()] not in (None, old) and pool.broken is None


def test_a_zygote_signalled_with_its_stopping_daemon_is_not_started_again(
        resident_node: NodeDaemon, entry: str) -> None:
    # Slurm signals every process of a step that ends: the zygote dies as the daemon
    # begins to stop, and a new one would import torch again only to be killed
    pool = resident_node.pool
    assert pool is not None
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=_owner())
        _run(c, "j1", entry, "report")                   # a ready zygote
        old = pool.zygote_pids()[Interpreter()]
        assert old is not None
        os.kill(old, signal.SIGTERM)    # before the daemon's own stop begins, as it
        pool.stopping()                   # comes (its handler runs a moment later)
        time.sleep(pool.RESTART_GRACE_S + 1.0)
        assert pool.zygote_pids()[Interpreter()] == old  # the dead one: no successor
        with pytest.raises(NodeUnavailable, match="it is stopping"):
            c.call(Op.ACTIVATE, job="j1", phase="rollout", entry=f"{entry}:report")


def test_a_stopping_pool_refuses_activations_as_node_unavailable(
        resident_node: NodeDaemon, entry: str) -> None:
    pool = resident_node.pool
    assert pool is not None
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=_owner())
        pool.shutdown()
        with pytest.raises(NodeUnavailable, match="takes no work now: it is stopping"):
            c.call(Op.ACTIVATE, job="j1", phase="rollout", entry=f"{entry}:report")


def test_the_worker_runs_as_the_jobs_uid_and_sees_only_its_paths(
        resident_node: NodeDaemon, entry: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to register a job for another uid")
    with NodeClient(resident_node.config.socket) as c:
        mine = c.register("j1", uid=NOBODY)
        other = c.register("j2", uid=NOBODY - 1)
        c.put_state(mine, "weights", {"w": torch.ones(2, 2)}, version=1)
        c.put_state(other, "weights", {"w": torch.ones(2, 2)}, version=1)
        got = _run(c, "j1", entry, "report")["result"]
        foreign = str(resident_node.store.seg_path(other, "weights"))
        peek = _run(c, "j1", entry, "peek", foreign)["result"]
    assert (got["uid"], got["euid"], got["groups"]) == (NOBODY, NOBODY, [])
    assert got["segments"] == {"weights": str(resident_node.store.seg_path(mine, "weights"))}
    assert peek == "PermissionError"


def test_deactivate_interrupts_a_phase_and_retires_the_worker_a_failing_entry_keeps_it(
        resident_node: NodeDaemon, entry: str) -> None:
    with NodeClient(resident_node.config.socket) as c:
        job = c.register("j1", uid=_owner())
        c.put_state(job, "weights", {"w": torch.ones(2, 2)}, version=1)
        marks = Path(entry).parent / "marks"
        marks.mkdir()
        marks.chmod(0o777)                        # the worker may run as nobody
        inside = marks / "inside"
        running = c.call(Op.ACTIVATE, job="j1", phase="sync", entry=f"{entry}:hang",
                         args=[str(inside)])
        wait_for(inside.exists, 60, f"{inside} (the entry runs)", interval_s=0.01)
        stopped = c.call(Op.DEACTIVATE, job="j1")
        broken = _run(c, "j1", entry, "no_such_function")
        fine = _run(c, "j1", entry, "report")
    assert stopped["state"] == "failed" and "PhaseCancelled" in stopped["error"], stopped
    assert broken["state"] == "failed" and "no_such_function" in broken["error"], broken
    assert fine["state"] == "exited"
    assert running["pid"] == stopped["pid"]
    assert broken["pid"] == fine["result"]["pid"] != running["pid"]   # a clean one


def test_a_cancel_inside_an_import_does_not_poison_the_next_phase(
        resident_node: NodeDaemon, entry: str, tmp_path: Path) -> None:
    """The import registers something global first (as torch.library or
    functools.singledispatch do), so importing it again in the same process fails."""
    mods = Path(entry).parent / "mods"
    mods.mkdir(mode=0o755)
    slow, inside = mods / "slow.flag", mods / "inside.flag"
    slow.touch()
    mods.chmod(0o777)                             # the worker may run as nobody
    (mods / "registers.py").write_text(
        "import os, sys, time\n"
        "reg = sys.modules.setdefault('_weave_test_registry', type(sys)('r'))\n"
        "if getattr(reg, 'done', False):\n"
        "    raise RuntimeError('registers: registered twice in this process')\n"
        "reg.done = True\n"
        f"open({str(inside)!r}, 'w').close()\n"
        f"while os.path.exists({str(slow)!r}):\n"
        "    time.sleep(0.05)\n")
    (mods / "registers.py").chmod(0o644)
    (mods / "imp.py").write_text(
        "import os, sys\n"
        "def run(ctx):\n"
        "    sys.path.insert(0, os.path.dirname(__file__))\n"
        "    import registers  # noqa: F401\n"
        "    return os.getpid()\n")
    (mods / "imp.py").chmod(0o644)
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=_owner())
        running = c.call(Op.ACTIVATE, job="j1", phase="rollout", entry=f"{mods}/imp.py:run")
        wait_for(inside.exists, 120, f"{inside} (the import registered, then loops)",
                 interval_s=0.01)
        stopped = c.call(Op.DEACTIVATE, job="j1")
        slow.unlink()
        after = _run(c, "j1", f"{mods}/imp.py", "run")
        restarts = c.call(Op.STATUS)["jobs"][0]["resident"]["restarts"]
    assert "PhaseCancelled" in (stopped["error"] or ""), (stopped, resident_log(resident_node))
    assert after["state"] == "exited", after       # before: "registered twice"
    assert after["result"] != running["pid"] and restarts == 1



def resident_log(daemon: NodeDaemon) -> str:
    """Every job's resident.log on the node (for a failure's message)."""
    return "\n".join(p.read_text(errors="replace")[-3000:]
                     for p in daemon.config.root.rglob("resident.log"))


def test_a_segment_listed_then_dropped_by_its_writer_is_skipped_not_fatal(
        shm_root: Path) -> None:
    """A resident worker attaches its job's segments as the daemon listed them; a gang
    engine's slice listed and then replaced or dropped by its writer meanwhile is left
    out (a phase that needs it finds it missing and says so), the rest attached."""
    store = SegmentStore(shm_root)
    job = JobRef("7", os.getuid())
    store.put_state(job, "weights", {"w": torch.ones(2)}, 1)
    store.put_state(job, "traj.e3", {"t": torch.zeros(1)}, 1)
    listed = {n: str(store.seg_path(job, n)) for n in ("weights", "traj.e3")}
    store.index_path(job, "traj.e3").unlink()   # its writer replaces it right now
    cache = AttachCache()
    got = cache.attach(store, job, listed)
    assert set(got) == {"weights"} and got["weights"].index.version == 1
    with pytest.raises(SegmentMissing, match=r"no segment 'traj\.e3'"):
        store.read_index(job, "traj.e3")
