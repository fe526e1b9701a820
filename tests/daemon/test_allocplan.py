"""Allocation planning of GPU shares (daemon/allocplan.py, "Shares"): a pooled group's
rollout rows hold some GPUs of a node, not the node; their shape, the wants a plan with
``rollout_gpus`` makes, and share rows as slots."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.daemon import allocplan
from weave_slurm.daemon.allocplan import ROLLOUT, RowShape, Want
from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.group import NodeRef
from weave_slurm.vocab import Pool


def _share(key: int, node: str, gpus: int, state: AllocState = AllocState.HELD) -> AllocRow:
    return AllocRow(key, 1, ROLLOUT, f"h20-{key}", "h20", 1, gpus, "h20", 1, state,
                    str(100 + key), (node,), "")


def test_a_share_asks_cpus_in_proportion_and_a_whole_node_as_before() -> None:
    assert allocplan.row_shape(8, 32, None) == RowShape(8, 32)
    assert allocplan.row_shape(8, 32, 8) == RowShape(8, 32)
    assert allocplan.row_shape(8, 32, 4) == RowShape(4, 16)
    assert allocplan.row_shape(8, 32, 3) == RowShape(3, 12)
    assert allocplan.row_shape(8, 2, 1) == RowShape(1, 1)     # at least one CPU
    for bad in (0, 9, -1):
        with pytest.raises(ConfigError, match=rf"rollout_gpus={bad}: a share holds 1 to 8 "):
            allocplan.row_shape(8, 32, bad)


def test_a_row_is_a_share_when_it_holds_fewer_gpus_than_its_nodes() -> None:
    assert allocplan.is_share(_share(1, "n0", 4), 8)
    assert not allocplan.is_share(_share(1, "n0", 8), 8)
    assert not allocplan.is_share(_share(1, "n0", 0), 8)   # a CPU pool's row


def test_a_pooled_plan_wants_shares_and_a_pinned_plan_whole_nodes() -> None:
    plan = GroupPlan(1, 1, (MemberPlan(7, (0,)),))
    assert allocplan.needs(plan, []).wants == (Want(ROLLOUT, 1), Want("train", 1))
    pooled = replace(plan, rollout_gpus=4)
    assert allocplan.needs(pooled, []).wants == (Want(ROLLOUT, 1, gpus=4), Want("train", 1))


def test_shares_on_one_node_are_slots_of_their_own() -> None:
    """Two share rows of the group on the same node: two slots naming that node, each
    with its row; the one no member is pinned to is surplus, the other kept."""
    rows = [_share(1, "h20-0", 4), _share(2, "h20-0", 4)]
    slots = allocplan.rollout_slots(rows)
    assert [(s.number, s.row.key, s.node) for s in slots] == [(0, 1, "h20-0"), (1, 2, "h20-0")]
    plan = GroupPlan(1, 1, (MemberPlan(7, (1,)),), rollout_gpus=4)
    assert allocplan.member_nodes(plan, 7, rows) == [(rows[1], "h20-0")]
    assert allocplan.kept_nodes(plan, rows) == [(rows[1], "h20-0")]
    assert allocplan.surplus(plan, rows) == [rows[0]]
    # its share lost: the member moves to a future slot, a share of the same width is wanted
    lost = [rows[0], replace(rows[1], state=AllocState.LOST)]
    needs = allocplan.needs(plan, lost)
    assert needs.plan.members[0].rollout_pins == (2,)
    assert needs.wants[0] == Want(ROLLOUT, 1, replaces=True, gpus=4)


def test_a_pooled_plan_is_stored_with_its_width() -> None:
    plan = GroupPlan(1, 1, (MemberPlan(7, (0,)), MemberPlan(8, (0,))), rollout_gpus=4)
    assert GroupPlan.from_json(plan.to_json()) == plan
    assert '"rollout_gpus"' not in replace(plan, rollout_gpus=None).to_json()  # as before
    assert GroupPlan.from_json(replace(plan, rollout_gpus=None).to_json()).rollout_gpus is None
    assert plan.without({8}) == replace(plan, members=plan.members[:1])   # keeps its width
    nested = replace(plan, then=replace(plan, members=plan.members[1:]))
    assert GroupPlan.from_json(nested.to_json()) == nested


def test_a_node_whose_allocation_ended_is_lost_though_another_holds_it_again() -> None:
    """Slurm gave a node set DOWN back, to the allocation that replaced the lost one:
    the runtime's node of the old allocation is lost all the same (its daemon is gone;
    the new allocation's is another). Without allocation ids (the local backend) a
    node is lost only when no held allocation names it."""
    def ref(name: str, alloc_id: str | None) -> NodeRef:
        return NodeRef(name, Pool.ROLLOUT, Path(f"/run/{name}.sock"),
                       None if alloc_id is None else "10.0.0.1", 1, alloc_id)

    old = _share(1, "h20-0", 8, AllocState.LOST)   # alloc id 101
    new = _share(2, "h20-0", 8)                   # alloc id 102, the same node
    other = _share(3, "h20-1", 8)                  # alloc id 103

    def by_node(_: AllocRow, node: str) -> str:
        return node

    layout = (ref("h20-0", "101"), ref("h20-1", "103"))
    assert allocplan.lost_nodes(layout, (old, new, other), by_node) == [layout[0]]
    assert allocplan.lost_nodes((ref("h20-0", "102"),), (old, new), by_node) == []
    assert allocplan.lost_nodes((ref("h20-0", None),), (old, new), by_node) == []
    assert allocplan.lost_nodes((ref("h20-0", None),), (old,), by_node) \
        == [ref("h20-0", None)]
