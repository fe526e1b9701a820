"""The store's plan values (daemon/records.py): a plan that waits for its movers to
leave (``GroupPlan.then``), as stored and as members leave."""

from __future__ import annotations

from dataclasses import replace

from weave_slurm.daemon import allocplan
from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState

NOW = GroupPlan(3, 1, (MemberPlan(1, (0,)), MemberPlan(2, (1,)), MemberPlan(3, (2,), 2)))
NEXT = GroupPlan(1, 1, (MemberPlan(1, (1,)), MemberPlan(2, (1,), 2)))


def test_a_plan_with_the_plan_it_takes_next_is_stored_as_it_is() -> None:
    plan = replace(NOW, then=NEXT)
    assert GroupPlan.from_json(plan.to_json()) == plan
    assert GroupPlan.from_json(NOW.to_json()).then is None   # older rows: no next plan


def test_the_next_plan_is_taken_once_only_its_members_are_left() -> None:
    plan = replace(NOW, then=NEXT)
    kept = plan.without({2})   # a member of both ends first: job 3 still keeps its place
    only_1 = GroupPlan(1, 1, (MemberPlan(1, (1,)),))
    assert kept.job_ids == (1, 3) and kept.then == only_1   # gone from both
    assert kept.without({3}) == only_1
    assert plan.without({3}) == NEXT
    assert replace(plan, then=None).without({3}).job_ids == (1, 2)   # withdrawn: as it was


def test_a_job_entering_with_the_next_plan_is_in_it_only() -> None:
    """Job 4's move into the group waits for its next plan: it is not a member now, it
    is one once job 3 is out, and a withdrawal of its move takes it out of ``then``."""
    nxt = GroupPlan(1, 1, (*NEXT.members, MemberPlan(4, (1,))))
    plan = replace(NOW, then=nxt)
    assert plan.job_ids == (1, 2, 3) and plan.next_ids == (4,)
    assert plan.without({3}) == nxt
    withdrawn = plan.without({4})
    assert withdrawn.job_ids == (1, 2, 3) and withdrawn.then == NEXT
    assert NOW.next_ids == ()


def _row(key: int, nodes: tuple[str, ...], state: AllocState) -> AllocRow:
    return AllocRow(key, 1, "rollout", f"h20-{key}", "h20", len(nodes), 8, "h20", 2, state,
                    str(key), nodes, "")


def test_a_lost_node_renames_the_next_plan_as_the_plan() -> None:
    """normalized: a retired slot pinned now and next moves to the same future slot, and
    a row only the next plan pins is not surplus."""
    plan = replace(NOW, then=NEXT)
    rows = [_row(1, ("n0",), AllocState.HELD), _row(2, ("n1",), AllocState.LOST),
            _row(3, ("n2",), AllocState.HELD)]
    fixed = allocplan.normalized(plan, rows)
    assert [m.rollout_pins for m in fixed.members] == [(0,), (3,), (2,)]
    assert fixed.then is not None and [m.rollout_pins for m in fixed.then.members] \
        == [(3,), (3,)]
    assert allocplan.normalized(fixed, rows) == fixed
    spare = [*rows, _row(4, ("n3",), AllocState.HELD)]
    later = GroupPlan(3, 1, (MemberPlan(1, (0,)),),
                      GroupPlan(1, 1, (MemberPlan(1, (3,)),)))   # row 4 holds slot 3
    assert [r.key for r in allocplan.surplus(later, spare)] == [3]
