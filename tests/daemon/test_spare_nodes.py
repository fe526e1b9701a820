"""A pooled group's spare nodes given back to Slurm (daemon/allocplan.py "Spare nodes"):
the reconcile loop over a real store and the CLI backend on a fake runner (the exact
``scontrol update`` it runs), as tests/daemon/test_reconcile.py."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon.test_reconcile import INSTANCE, T0, Slurm, _reconciler, _submit
from weave_slurm.clock import VirtualClock
from weave_slurm.daemon.driver import IdleDriver
from weave_slurm.daemon.reconcile import Reconciler
from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState
from weave_slurm.daemon.store import Store
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner

NAME = f"weave-g{INSTANCE}.1-h20-0"


@dataclass
class Pool:
    store: Store
    slurm: Slurm
    rec: Reconciler
    alloc_id: str
    job: int

    def row(self) -> AllocRow:
        (row,) = [a for a in self.store.allocs(1) if a.role == "rollout"]
        return row

    def updates(self) -> list[tuple[str, ...]]:
        return [c.argv for c in self.slurm.fake.calls if c.argv[:2] == ("scontrol", "update")]


def _scontrol_update(slurm: Slurm, argv: tuple[str, ...]) -> FakeReply:
    """``scontrol update JobId=X NodeList=...`` as Slurm 22.05 does it: the job goes on on
    the nodes named."""
    args = dict(a.partition("=")[::2] for a in argv[2:])
    job = slurm.jobs[int(args["JobId"])]
    job.update(nodes=args["NodeList"], node_count=len(args["NodeList"].split(",")))
    return FakeReply()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    """A pooled group whose plan pins its member to the first node of its two-node row
    of 4-GPU shares (the pool narrowed: the second node is spare)."""
    store, fake = Store(tmp_path / "w.db"), FakeRunner()
    slurm = Slurm(fake)
    fake.on(["scontrol", "update"], lambda argv: _scontrol_update(slurm, argv))
    job = _submit(store)
    plan = GroupPlan(1, 1, (MemberPlan(job, (0,)),), rollout_gpus=4)
    store.commit_placement([(1, f"{INSTANCE}.1", plan, True)], [(job, 1, "pooled")], T0)
    key = store.add_alloc(group_id=1, role="rollout", pool="h20-0", partition="h20",
                          node_count=2, gpus_per_node=4, gpu_type="h20", cpus_per_node=1,
                          now=T0, reason="initial")
    alloc_id = slurm.add(NAME, ("h20-0", "h20-1"))
    store.transition("alloc", key, AllocState.ALLOCATING, "requesting", T0)
    store.transition("alloc", key, AllocState.HELD, "granted", T0, alloc_id=alloc_id,
                     nodes=json.dumps(["h20-0", "h20-1"]))
    yield Pool(store, slurm, _reconciler(store, fake, VirtualClock(T0)), alloc_id, job)
    store.close()


def test_a_spare_node_is_written_as_given_back_then_slurm_shrinks_the_row(pool: Pool) -> None:
    """The node daemon there is told to end, the node written as given back, and the
    next tick asks Slurm to shrink the row (the daemon had a tick to end)."""
    left: list[tuple[int, tuple[str, ...]]] = []

    class Leaving(IdleDriver):
        def leave(self, alloc: AllocRow, nodes: Sequence[str]) -> None:
            left.append((alloc.key, tuple(nodes)))

    pool.rec.allocations.driver = Leaving()
    pool.rec.allocations.give_back_spare(T0 + 1)
    row = pool.row()
    assert left == [(row.key, ("h20-1",))] and pool.updates() == []
    assert (row.state, row.gone, row.held_nodes) == (AllocState.HELD, ("h20-1",), ("h20-0",))
    assert "gave back node(s) h20-1" in row.reason
    pool.rec.tick()
    assert pool.updates() == [("scontrol", "update", f"JobId={pool.alloc_id}",
                               "NodeList=h20-0")]
    assert pool.slurm.jobs[int(pool.alloc_id)]["nodes"] == "h20-0"
    pool.rec.tick()   # nothing spare nor held beyond: asked once
    assert len(pool.updates()) == 1 and len(left) == 1


def test_a_node_written_as_given_back_but_not_shrunk_is_asked_again_after_a_restart(
        pool: Pool) -> None:
    """weaved killed between writing ``gone`` and ``scontrol update``: the next tick sees
    Slurm still hold the node and asks again."""
    pool.store.update("alloc", pool.row().key, gone=json.dumps([["h20-1", T0]]))
    pool.rec.tick()
    assert ("scontrol", "update", f"JobId={pool.alloc_id}", "NodeList=h20-0") \
        in pool.updates()
    assert pool.slurm.jobs[int(pool.alloc_id)]["nodes"] == "h20-0"
    assert pool.row().state is AllocState.HELD   # not taken for a lost allocation


def test_the_node_in_use_by_the_runtime_is_not_given_back(pool: Pool) -> None:
    class Busy(IdleDriver):
        def in_use(self, group_id: int) -> frozenset[str]:
            return frozenset({f"h20-1.{pool.alloc_id}"})   # a share's node daemon key

    pool.rec.allocations.driver = Busy()
    pool.rec.allocations.give_back_spare(T0 + 1)
    assert pool.row().gone == ()
