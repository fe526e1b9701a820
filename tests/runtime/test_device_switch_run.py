"""The device switch in a group on local node daemons (CPU, ``device_switch = "on"``).

Two members share one training node and one rollout node, so every phase of one
follows a phase of the other there: before each, the node daemon switches the other
member's training state out of its worker (into ``device.train`` in shm, its tensors
freed) and the incoming member's worker switches its own back in. Each member must
still end bit-identical to a solo run, and the switches must really have happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.processes import node_status
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, group_weights, leave_all
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.member import RunnerConfig
from weave_slurm.runtime.runner import GroupRunner

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STEPS = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    with running_fleet(tmp_path_factory.mktemp("devsw"), "devsw", "weave-test-devsw-") as f:
        yield f


def _run(fleet: NodeFleet, mode: str) -> tuple[GroupRunner, list[MemberSpec]]:
    specs = [MemberSpec(f"sw{mode}{i}", seed=41 + i, steps=STEPS, options=OPTIONS)
             for i in range(2)]
    ex = GroupRunner(fleet.layout, specs,  # type: ignore[arg-type]
                     config=RunnerConfig(device_switch=mode))
    ex.run(timeout_s=300)
    assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2, \
        [(s.job_id, ex.members[s.job_id].error) for s in specs]
    return ex, specs


def _train_device(fleet: NodeFleet) -> dict[str, Any]:
    assert fleet.layout is not None
    device: dict[str, Any] = node_status(fleet.layout.train[0].socket_path)["device"]
    return device


def test_switched_members_learn_what_they_learn_alone(fleet: NodeFleet) -> None:
    before = int(_train_device(fleet)["switched"])
    ex, specs = _run(fleet, "on")
    try:
        for spec in specs:
            assert_same_as_solo(ex, spec)
        device = _train_device(fleet)
        # init a, init b (a out), train a (b out), ...: every training phase but the
        # first switched the other member out
        assert int(device["switched"]) - before >= 2 * STEPS - 1, device
        last = device["last"]
        assert isinstance(last, dict) and last["device_held_bytes"] == 0, last
        moved = [s for s in last["switches"] if s["role"] == "train"]
        assert moved and moved[0]["moved_bytes"] > 0 and moved[0]["held_bytes"] == 0, last
        assert {s["segment"] for s in moved} == {"device.train"}
        assert set(device["tenants"]) >= {s.job_id for s in specs}
        # what GPU admission plans with reaches the profiler (here: the tensors' bytes)
        measured = ex.profiler.snapshot()
        for spec in specs:
            assert measured[spec.job_id].train_gpu_peak_bytes >= moved[0]["moved_bytes"]
    finally:
        leave_all(ex, specs)


def test_without_the_switch_nothing_moves(fleet: NodeFleet) -> None:
    before = int(_train_device(fleet)["switched"])
    ex, specs = _run(fleet, "off")
    try:
        for spec in specs:
            assert_same_as_solo(ex, spec)
        assert int(_train_device(fleet)["switched"]) == before
    finally:
        leave_all(ex, specs)


REPO = str(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("level", [1, 2])
def test_engines_that_sleep_are_woken_with_the_nodes_weights(fleet: NodeFleet,
                                                            level: int) -> None:
    """Rollout through a fake engine with vLLM's sleep/wake contract: before the other
    member's rollout the daemon puts it to sleep (level 2: weights discarded), and its
    next rollout wakes it and loads the node's ``weights``; its training offloads to
    private host memory, which the training node's budget charges while it is out."""
    specs = [MemberSpec(f"zz{level}{i}", entry_point="tests.harness.sleepy_engine:job",
                        seed=51 + i, steps=STEPS, pythonpath=(REPO,),
                        options={**OPTIONS, "sleep_level": level}) for i in range(2)]
    ex = GroupRunner(fleet.layout, specs,  # type: ignore[arg-type]
                     config=RunnerConfig(device_switch="on"))
    assert fleet.layout is not None
    rollout, train = fleet.layout.rollout[0], fleet.layout.train[0]
    r0 = int(node_status(rollout.socket_path)["device"]["switched"])
    try:
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2, \
            [(s.job_id, ex.members[s.job_id].error) for s in specs]
        for spec in specs:    # what it learns alone, and what the plain job learns
            assert_same_as_solo(ex, spec)
            plain = run_solo(MemberSpec(spec.job_id, seed=spec.seed, steps=STEPS,
                                        options=OPTIONS))
            assert all(torch.equal(group_weights(ex, spec.job_id)[k], v)
                       for k, v in plain.weights.items())
        device = node_status(rollout.socket_path)["device"]
        assert int(device["switched"]) - r0 >= 2 * STEPS - 1, device
        out = device["last"]["switches"][0]
        assert out["role"] == "rollout"     # level 1 keeps the weights on the host
        assert (out["host_bytes"] > 0) if level == 1 else (out["host_bytes"] == 0), out
        # the member switched out last on the training node: its offload is charged
        status = node_status(train.socket_path)
        held = status["device"]["last"]
        host = int(held["host_bytes"])
        assert host > 0, held
        row = next(j for j in status["jobs"] if j["job"] == held["job"])
        segments = sum(int(s["size_bytes"]) for s in row["segments"].values())
        assert status["memory"]["per_job_bytes"][held["job"]] == segments + host
    finally:
        leave_all(ex, specs)
