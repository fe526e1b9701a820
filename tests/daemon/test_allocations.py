"""Asking for allocations (daemon/allocations.py): how long a rollout allocation may pend
in Slurm's queue while a pool of this weaved still gives nodes back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.specs import job_spec, stored
from weave_slurm.daemon.allocations import (
    GIVING_BACK_IMMEDIATE_S,
    GroupAllocations,
    PoolRequest,
)
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.retries import NodeDaemonRetries
from weave_slurm.daemon.states import AllocState, GroupState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import InsufficientResources
from weave_slurm.model.profile import simple_profile
from weave_slurm.slurm.backend import AllocationRequest

T0 = 1000.0


class _Pending:
    """A backend whose every allocation pends (and is cancelled): the requests it got."""

    def __init__(self) -> None:
        self.asked: list[AllocationRequest] = []

    def allocate(self, request: AllocationRequest) -> Any:
        self.asked.append(request)
        raise InsufficientResources(f"sbatch {request.job_name}: still pending; cancelled")


def _store(tmp_path: Path, pins: tuple[int, ...]) -> Store:
    """Group 1: a pool pinned to ``pins`` of its held row of two h20 nodes (8 GPUs of
    each); group 2: a new pool whose rollout row is wanted."""
    store = Store(tmp_path / "w.db")
    a, b = (store.add_job(uid=0, user="root", name=n,
                          **stored(n, job_spec(n, seed=1, iterations=1)), source=f"{n}.toml",
                          now=T0, profile=simple_profile(n, 1, 1, 1.5)) for n in "ab")
    store.commit_placement([(1, "1", GroupPlan(len(pins), 1, (MemberPlan(a, pins),),
                                               rollout_gpus=8), True),
                            (2, "2", GroupPlan(1, 1, (MemberPlan(b, (0,)),), rollout_gpus=8),
                             True)],
                           [(a, 1, "new_group into group 1"), (b, 2, "new_group into group 2")],
                           T0)
    for role, nodes in (("rollout", ["h20-0", "h20-1"]), ("train", ["h800-0"])):
        key = store.add_alloc(group_id=1, role=role, pool=f"{role}-0", partition=role,
                              node_count=len(nodes), gpus_per_node=8, gpu_type=None,
                              cpus_per_node=1, now=T0, reason="initial")
        store.transition("alloc", key, AllocState.ALLOCATING, "asking", T0)
        store.transition("alloc", key, AllocState.HELD, "granted", T0,
                         alloc_id=f"1{role[0]}", nodes=json.dumps(nodes))
    store.transition("group", 1, GroupState.ACTIVE, "held", T0)
    return store


@pytest.mark.parametrize(("pins", "immediate_s"),
                         [((0,), GIVING_BACK_IMMEDIATE_S), ((0, 1), 10)])
def test_a_rollout_allocation_pends_briefly_while_a_pool_gives_nodes_back(
        tmp_path: Path, pins: tuple[int, ...], immediate_s: int) -> None:
    """Group 1's plan pins one of its row's two nodes: the other is to be given back, and
    group 2's rollout allocation (which likely waits for it) pends for 1 s a try, not
    the site's 10 s that would hold weaved's loop, and so the give-back, meanwhile."""
    store = _store(tmp_path, pins)
    backend = _Pending()
    pools = {role: PoolRequest(role, 8, None, 1) for role in ("rollout", "train")}
    allocations = GroupAllocations(
        store, backend, pools, driver=None,  # type: ignore[arg-type]
        node_retries=NodeDaemonRetries(), tag="t", immediate_s=10,
        fail_placed=lambda *a: None, end_step=lambda *a: None)
    allocations.ensure(T0)
    asked = {(r.group_id, r.pool): r.immediate_s for r in backend.asked}
    assert asked == {("2", "rollout-0"): immediate_s,   # group 2's rollout row
                     ("2", "train-0"): 10}, backend.asked   # training never waits for it
    store.close()
