"""SlurmCliBackend against the session's Slurm cluster (slurmctld + 4 slurmds, each node a
host of its own: what a step writes for the test to read goes to the shared work dir)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.slurm.session_cluster import SessionCluster
from weave_slurm.errors import InfeasibleRequest, InsufficientResources
from weave_slurm.slurm.backend import (
    AllocationRequest,
    ResourceSpec,
    StepHandle,
    StepSpec,
    StepState,
)
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.command_runner import run_command
from weave_slurm.slurm.templates import render_allocation

pytestmark = pytest.mark.slurm

H20 = ResourceSpec("h20", 2, 4, "h20", 4)
H800 = ResourceSpec("h800", 1, 4, "h800", 4)


def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def backend(slurm_cluster: SessionCluster, tmp_path: Path) -> Iterator[SlurmCliBackend]:
    b = SlurmCliBackend(env=slurm_cluster.env, log_dir=tmp_path / "steps")
    yield b
    for alloc in b.list_allocations():
        b.release(alloc.alloc_id)
    wait_until(lambda: not b.list_allocations(), "allocations to end")


def test_nodes_report_typed_gpus(backend: SlurmCliBackend) -> None:
    nodes = {n.name: n for n in backend.nodes()}
    assert set(nodes) == {"h20-0", "h20-1", "h800-0", "h800-1"}
    assert (nodes["h20-1"].gpu_type, nodes["h20-1"].gpu_count) == ("h20", 8)
    assert nodes["h800-0"].partitions == ("h800",)


def test_two_allocation_group_steps_cancel_adopt_release(backend: SlurmCliBackend,
                                                         tmp_path: Path) -> None:
    roll = backend.allocate(AllocationRequest("41", "h20", (H20,), time_limit_min=10))
    train = backend.allocate(AllocationRequest("41", "h800", (H800,), time_limit_min=10))
    assert roll.nodes == ("h20-0", "h20-1") and roll.components[0].gpus_per_node == 4
    assert train.nodes[0].startswith("h800-")
    node_d = backend.launch_step(roll.alloc_id, StepSpec("node-d", ("sleep", "60"), ntasks=2))
    rollout = backend.launch_step(roll.alloc_id, StepSpec("rollout", ("sleep", "60"),
                                                          ntasks=2, cpus_per_task=2))
    trainer = backend.launch_step(train.alloc_id, StepSpec("train", ("sleep", "60")))
    wait_until(lambda: {s.name for s in backend.list_steps(roll.alloc_id)} ==
               {"node-d", "rollout"}, "both overlapping steps in squeue")
    steps = {s.name: s for s in backend.list_steps(roll.alloc_id)}
    assert steps["rollout"].nodes == ("h20-0", "h20-1") and steps["rollout"].ntasks == 2
    wait_until(lambda: [s.name for s in backend.list_steps(train.alloc_id)] == ["train"],
               "train step in squeue")

    backend.cancel_step(rollout)
    assert backend.poll_step(rollout).state is StepState.CANCELLED
    assert [s.name for s in backend.list_steps(roll.alloc_id)] == ["node-d"]
    assert backend.poll_step(node_d).state is StepState.RUNNING

    restarted = SlurmCliBackend(env=backend.env)  # a new daemon process adopts by comment
    adopted = {a.pool: a for a in restarted.list_allocations("weave-g41-")}
    assert {p: (a.alloc_id, a.group_id) for p, a in adopted.items()} == {
        "h20": (roll.alloc_id, "41"), "h800": (train.alloc_id, "41")}
    assert restarted.poll_step(StepHandle(roll.alloc_id, "node-d", 0)).state \
        is StepState.RUNNING

    restarted.release(roll.alloc_id)
    restarted.release(train.alloc_id)
    wait_until(lambda: not restarted.list_allocations("weave-g41-"), "release")
    wait_until(lambda: backend.poll_step(node_d).state is not StepState.RUNNING, "srun exit")
    wait_until(lambda: backend.poll_step(trainer).state is not StepState.RUNNING, "srun exit")
    assert backend.poll_step(trainer).state is StepState.CANCELLED


def test_heterogeneous_allocation_and_het_group_step(backend: SlurmCliBackend,
                                                     tmp_path: Path) -> None:
    alloc = backend.allocate(AllocationRequest("42", "het", (ResourceSpec("h20", 1, 2, "h20"),
                                                             ResourceSpec("h800", 1, 2, "h800"))))
    assert alloc.heterogeneous
    assert [c.partition for c in alloc.components] == ["h20", "h800"]
    log = tmp_path / "het.log"
    h = backend.launch_step(alloc.alloc_id, StepSpec(
        "probe", ("sh", "-c", "echo $SLURMD_NODENAME"), het_group=1, log_path=log))
    wait_until(lambda: backend.poll_step(h).state.finished, "het step")
    assert backend.poll_step(h).state is StepState.COMPLETED
    assert log.read_text().strip() == alloc.components[1].nodes[0]


def test_overlapping_gpu_steps_share_the_first_gpus(backend: SlurmCliBackend,
                                                   shared_tmp: Path) -> None:
    """Slurm 22.05: --overlap steps share GRES (the LocalBackend mirrors this)."""
    alloc = backend.allocate(AllocationRequest("43", "h800", (ResourceSpec("h800", 1, 8,
                                                                           "h800"),)))
    out = shared_tmp / "gpus"   # written on the node's host
    out.mkdir()
    handles = [backend.launch_step(alloc.alloc_id, StepSpec(
        f"g{i}", ("sh", "-c", f"echo $SLURM_STEP_GPUS > {out}/g{i}.tmp; "
                  f"mv {out}/g{i}.tmp {out}/g{i}; sleep 60"),
        gpus_per_node=4)) for i in range(2)]
    wait_until(lambda: len(list(out.glob("g?"))) == 2, "both GPU steps to start")
    gpus = [(out / f"g{i}").read_text().strip() for i in range(2)]
    assert gpus == ["0,1,2,3", "0,1,2,3"]
    for h in handles:
        backend.cancel_step(h)
    assert all(backend.poll_step(h).state is StepState.CANCELLED for h in handles)


def test_a_running_share_gives_back_a_node_and_goes_on_on_the_other(
        backend: SlurmCliBackend) -> None:
    """``shrink`` (a pooled group's spare node, daemon/allocplan.py): Slurm gives the
    node's GPUs back, ends the step's task there, and the job and the step go on on the
    node kept; asking again is no error."""
    share = ResourceSpec("h20", 2, 2, "h20", 2)
    alloc = backend.allocate(AllocationRequest("47", "h20", (share,), time_limit_min=10))
    assert alloc.nodes == ("h20-0", "h20-1")
    step = backend.launch_step(alloc.alloc_id, StepSpec("node-d", ("sleep", "60"), ntasks=2,
                                                        node_count=2))
    wait_until(lambda: [s.name for s in backend.list_steps(alloc.alloc_id)] == ["node-d"],
               "the two-node step in squeue")
    backend.shrink(alloc.alloc_id, ("h20-0",))
    (now,) = [a for a in backend.list_allocations() if a.alloc_id == alloc.alloc_id]
    assert now.nodes == ("h20-0",) and now.components[0].gpus_per_node == 2
    free = {n.name: n.state for n in backend.nodes()}
    assert free["h20-1"] == "idle", free   # its share is Slurm's again
    time.sleep(1)
    assert backend.poll_step(step).state is StepState.RUNNING   # its task on h20-0
    backend.shrink(alloc.alloc_id, ("h20-0",))   # again (a weaved restart): no error


def test_refusals_name_the_next_move(backend: SlurmCliBackend) -> None:
    with pytest.raises(InfeasibleRequest, match="not available"):
        backend.allocate(AllocationRequest("44", "h20", (ResourceSpec("h20", 1, 9, "h20"),)))
    full = ResourceSpec("h800", 2, 8, "h800")
    backend.allocate(AllocationRequest("44", "h800", (full,)))
    with pytest.raises(InsufficientResources, match="retry later"):
        backend.allocate(AllocationRequest("45", "h800", (ResourceSpec("h800", 1, 1, "h800"),),
                                           immediate_s=1))


def test_rendered_allocation_script_is_accepted_by_sbatch(slurm_cluster: SessionCluster,
                                                          tmp_path: Path) -> None:
    script = tmp_path / "alloc.sbatch"
    script.write_text(render_allocation(AllocationRequest("46", "het", (H20, H800),
                                                          time_limit_min=5)))
    res = run_command(["sbatch", "--test-only", str(script)], env=slurm_cluster.env)
    assert "to start at" in res.stderr + res.stdout
