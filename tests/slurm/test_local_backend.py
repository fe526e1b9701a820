"""LocalBackend on real processes: allocation bookkeeping, steps, adoption after restart."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources, StateError
from weave_slurm.slurm.allocation_watch import LOCAL_STATE_ENV, Verdict, ask_local
from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec, StepSpec, StepState
from weave_slurm.slurm.cluster_config import ClusterLayout, PoolShape
from weave_slurm.slurm.local_backend import LocalBackend

ENV_DUMP = ("import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith(('SLURM', 'CUDA', 'WEAVE'))}, open(sys.argv[1] + "
            "os.environ['SLURM_PROCID'], 'w'))")


def _h20(nodes: int = 2, gpus: int = 4, cpus: int = 4) -> ResourceSpec:
    return ResourceSpec("h20", nodes, gpus, "h20", cpus)


def _wait(backend: LocalBackend, handle: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while backend.poll_step(handle).state is StepState.RUNNING:  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "step did not finish"
        time.sleep(0.02)


def test_allocations_take_free_gpus_and_refuse_when_full(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    a1 = b.allocate(AllocationRequest("1", "h20", (_h20(),)))
    a2 = b.allocate(AllocationRequest("2", "h20", (_h20(),)))
    assert a1.nodes == a2.nodes == ("h20-0", "h20-1")
    assert (a1.group_id, a1.pool, a1.name) == ("1", "h20", "weave-g1-h20")
    with pytest.raises(InsufficientResources, match="retry later"):
        b.allocate(AllocationRequest("3", "h20", (_h20(nodes=1, gpus=1),)))
    assert {n.name: n.state for n in b.nodes()} == {
        "h20-0": "allocated", "h20-1": "allocated", "h800-0": "idle", "h800-1": "idle"}
    b.release(a1.alloc_id)
    a3 = b.allocate(AllocationRequest("3", "h20", (_h20(nodes=1, gpus=1),)))
    assert a3.nodes == ("h20-0",)


def test_a_shrunk_allocation_frees_a_node_and_ends_only_its_tasks_there(
        tmp_path: Path) -> None:
    """As Slurm's ``scontrol update JobId=X NodeList=...``: the node given back is free
    again, the step's task on it ends, the other goes on."""
    b = LocalBackend(tmp_path)
    a = b.allocate(AllocationRequest("1", "h20", (_h20(gpus=8),)))
    step = b.launch_step(a.alloc_id, StepSpec("d", ("sleep", "60"), ntasks=2, node_count=2))
    b.shrink(a.alloc_id, ("h20-0",))
    (now,) = b.list_allocations()
    assert now.nodes == ("h20-0",)
    assert {n.name: n.state for n in b.nodes()}["h20-1"] == "idle"
    assert b.poll_step(step).state is StepState.RUNNING
    b.shrink(a.alloc_id, ("h20-0",))   # again: nothing to do
    with pytest.raises(ConfigError, match="keep at least one"):
        b.shrink(a.alloc_id, ("h20-1",))
    b.release(a.alloc_id)


@pytest.mark.parametrize(("spec", "match"), [
    (ResourceSpec("a100", 1, 1), "does not exist; valid: \\['h20', 'h800'\\]"),
    (ResourceSpec("h20", 3, 1), "node_count=3"),
    (ResourceSpec("h20", 1, 9), "gpus_per_node=9"),
    (ResourceSpec("h20", 1, 1, "h800"), "GPU type"),
])
def test_infeasible_requests(tmp_path: Path, spec: ResourceSpec, match: str) -> None:
    with pytest.raises(InfeasibleRequest, match=match):
        LocalBackend(tmp_path).allocate(AllocationRequest("1", "x", (spec,)))


def test_restarted_backend_adopts_allocations_and_steps(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    a = b.allocate(AllocationRequest("7", "h20", (_h20(),)))
    other = b.allocate(AllocationRequest("7", "h800", (ResourceSpec("h800", 1, 8, "h800"),)))
    handle = b.launch_step(a.alloc_id, StepSpec("node-d", ("sleep", "30"), ntasks=2))
    fresh = LocalBackend(tmp_path)  # "restart": a new object reading the same state dir
    adopted = fresh.list_allocations()
    assert [(x.alloc_id, x.group_id, x.pool) for x in adopted] == [
        (a.alloc_id, "7", "h20"), (other.alloc_id, "7", "h800")]
    assert [s.name for s in fresh.list_steps(a.alloc_id)] == ["node-d"]
    assert fresh.poll_step(handle).state is StepState.RUNNING
    fresh.release(a.alloc_id)  # kills the step started by the "old" process
    _wait(b, handle)
    assert b.poll_step(handle).state is StepState.CANCELLED
    assert [x.alloc_id for x in fresh.list_allocations()] == [other.alloc_id]
    assert fresh.list_allocations(prefix="weave-g8") == ()


def test_allocations_are_listed_by_uid_and_instance_tag_as_on_slurm(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    mine = b.allocate(AllocationRequest("t1.1", "h20-0", (_h20(nodes=1, gpus=1),),
                                        instance="t1"))
    plain = b.allocate(AllocationRequest("1", "h20-0", (_h20(nodes=1, gpus=1),)))
    theirs = b.allocate(AllocationRequest("2", "h20-0", (_h20(nodes=1, gpus=1),)))
    assert (mine.instance, plain.instance) == ("t1", "default")
    state = json.loads((tmp_path / "local_backend.json").read_text())
    state["allocations"][theirs.alloc_id]["uid"] = b.uid + 1   # another user's record
    (tmp_path / "local_backend.json").write_text(json.dumps(state))
    ids = lambda **kw: [a.alloc_id for a in b.list_allocations("weave-g", **kw)]  # noqa: E731
    assert ids() == [mine.alloc_id, plain.alloc_id]
    assert ids(instance="t1") == [mine.alloc_id]
    assert ids(instance="default") == [plain.alloc_id]   # "weave-g" is a prefix of t1's too


def test_step_env_is_slurm_like_and_overlapping_steps_share_gpus(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "state")
    a = b.allocate(AllocationRequest("1", "h20", (_h20(gpus=4),)))
    hold = b.launch_step(a.alloc_id, StepSpec("hold", ("sleep", "30"), ntasks=2,
                                              gpus_per_node=2))
    out = tmp_path / "env"
    h = b.launch_step(a.alloc_id, StepSpec("dump", (sys.executable, "-c", ENV_DUMP, str(out)),
                                           ntasks=3, gpus_per_node=2, env={"WEAVE_X": "y"}))
    _wait(b, h)
    assert b.poll_step(h).state is StepState.COMPLETED
    envs = [json.loads((tmp_path / f"env{i}").read_text()) for i in range(3)]
    assert [e["SLURMD_NODENAME"] for e in envs] == ["h20-0", "h20-0", "h20-1"]
    assert [e["SLURM_LOCALID"] for e in envs] == ["0", "1", "0"]
    assert {e["SLURM_JOB_ID"] for e in envs} == {a.alloc_id}
    assert {e["SLURM_STEP_ID"] for e in envs} == {"1"}
    assert {e["SLURM_NTASKS"] for e in envs} == {"3"} and envs[0]["WEAVE_X"] == "y"
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0,1"}, "--overlap shares GRES"
    with pytest.raises(InfeasibleRequest, match="gpus_per_node=5"):
        b.launch_step(a.alloc_id, StepSpec("more", ("true",), ntasks=2, gpus_per_node=5))
    b.cancel_step(hold)
    assert b.poll_step(hold).state is StepState.CANCELLED
    assert b.list_steps(a.alloc_id) == ()


def test_failed_step_reports_its_exit_code_and_log(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    a = b.allocate(AllocationRequest("1", "h20", (_h20(nodes=1),)))
    log = tmp_path / "step.log"
    h = b.launch_step(a.alloc_id, StepSpec("bad", ("sh", "-c", "echo oops; exit 7"),
                                           log_path=log))
    _wait(b, h)
    st = b.poll_step(h)
    assert (st.state, st.returncode) == (StepState.FAILED, 7)
    assert log.read_text() == "oops\n"


def test_het_group_and_step_errors(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    a = b.allocate(AllocationRequest("2", "het", (_h20(nodes=1),
                                                  ResourceSpec("h800", 1, 8, "h800", 8))))
    assert a.heterogeneous and a.nodes == ("h20-0", "h800-0")
    out = tmp_path / "het"
    h = b.launch_step(a.alloc_id, StepSpec("t", (sys.executable, "-c", ENV_DUMP, str(out)),
                                           het_group=1))
    _wait(b, h)
    env = json.loads((tmp_path / "het0").read_text())
    assert env["SLURMD_NODENAME"] == "h800-0"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    with pytest.raises(InfeasibleRequest, match="het_group=2"):
        b.launch_step(a.alloc_id, StepSpec("x", ("true",), het_group=2))
    with pytest.raises(InfeasibleRequest, match="nodelist"):
        b.launch_step(a.alloc_id, StepSpec("x", ("true",), nodelist=("h20-1",)))
    with pytest.raises(StateError, match="does not exist"):
        b.launch_step("999", StepSpec("x", ("true",)))


def test_custom_layout_and_corrupt_state(tmp_path: Path) -> None:
    layout = ClusterLayout((PoolShape("h20", "h20", 3, gpus_per_node=2),))
    b = LocalBackend(tmp_path, layout)
    assert [n.name for n in b.nodes()] == ["h20-0", "h20-1", "h20-2"]
    (tmp_path / "local_backend.json").write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        b.list_allocations()


def test_interrupted_launch_tasks_are_adopted_not_orphaned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher killed after starting a task but before recording its pid."""
    import subprocess

    b = LocalBackend(tmp_path)
    alloc = b.allocate(AllocationRequest("1", "h20", (_h20(),)))
    started: list[subprocess.Popen[bytes]] = []
    real_spawn = LocalBackend._spawn_task

    def spawn_then_die(self: LocalBackend, *args: object) -> subprocess.Popen[bytes]:
        started.append(real_spawn(self, *args))  # type: ignore[arg-type]
        raise KeyboardInterrupt  # the launcher dies before it records the task

    monkeypatch.setattr(LocalBackend, "_spawn_task", spawn_then_die)
    spec = StepSpec("sleeper", (sys.executable, "-c", "import time; time.sleep(60)"))
    with pytest.raises(KeyboardInterrupt):
        b.launch_step(alloc.alloc_id, spec)
    monkeypatch.undo()
    fresh = LocalBackend(tmp_path)  # a restarted daemon
    (step,) = fresh.list_steps(alloc.alloc_id)
    assert step.name == "sleeper"
    fresh.release(alloc.alloc_id)
    started[0].wait(timeout=20)
    assert started[0].returncode is not None


def test_a_piped_step_talks_over_its_stdin_and_stdout(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "state")
    a = b.allocate(AllocationRequest("1", "h20", (_h20(nodes=2),)))
    echo = ("import os, sys\nfor line in sys.stdin:\n"
            "    print(os.environ['SLURMD_NODENAME'], line.strip(), flush=True)\n"
            "print('bye', file=sys.stderr)")
    log = tmp_path / "piped.log"
    proc = b.open_step(a.alloc_id, StepSpec("pipe", (sys.executable, "-c", echo), ntasks=1,
                                            node_count=1, nodelist=("h20-1",), log_path=log))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"ping\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"h20-1 ping\n"        # ran "on" the node asked for
    assert [s.name for s in b.list_steps(a.alloc_id)] == ["pipe"]
    proc.stdin.close()                                      # closing its stdin ends it
    assert proc.wait(timeout=20) == 0 and log.read_text().strip() == "bye"
    with pytest.raises(ConfigError, match="one task"):
        b.open_step(a.alloc_id, StepSpec("two", ("true",), ntasks=2))


def _zombies() -> list[str]:
    """This process's children that exited and were not waited for (``<defunct>``)."""
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                out.append(stat.split(")")[0])
    return out


def test_a_released_allocation_leaves_no_defunct_child(tmp_path: Path) -> None:
    """Issue 33, defect 6: a released allocation's tasks are waited for, not left
    ``[sleep] <defunct>`` under the process that launched them."""
    b = LocalBackend(tmp_path / "state")
    a = b.allocate(AllocationRequest("1", "h20", (_h20(),)))
    h = b.launch_step(a.alloc_id, StepSpec("hold", ("sleep", "30"), ntasks=2))
    b.release(a.alloc_id)
    assert _zombies() == []
    assert b.poll_step(h).state is StepState.CANCELLED


def test_a_task_sees_its_allocation_held_until_it_is_released(tmp_path: Path) -> None:
    """The local backend's tasks read its state file for their allocation watch
    (slurm/allocation_watch.py): listed while held, gone once released or removed."""
    b = LocalBackend(tmp_path / "state")
    a = b.allocate(AllocationRequest("1", "h20", (_h20(nodes=1),)))
    out = tmp_path / "env"
    h = b.launch_step(a.alloc_id, StepSpec("dump", (sys.executable, "-c", ENV_DUMP, str(out))))
    _wait(b, h)
    state = Path(json.loads((tmp_path / "env0").read_text())[LOCAL_STATE_ENV])
    assert ask_local(state, a.alloc_id).verdict is Verdict.RUNNING
    b.release(a.alloc_id)
    gone = ask_local(state, a.alloc_id)
    assert gone.verdict is Verdict.GONE and a.alloc_id in gone.detail
    shutil.rmtree(tmp_path / "state")
    gone = ask_local(state, a.alloc_id)
    assert gone.verdict is Verdict.GONE and "is gone" in gone.detail
    state.parent.mkdir()
    state.write_text("{not json")
    assert ask_local(state, a.alloc_id).verdict is Verdict.NO_ANSWER
