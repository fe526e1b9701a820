"""The stored plan of a group keeps what placement decided, turns and co-location
included."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.specs import stored
from weave_slurm.daemon import membership
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.store import Store
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity, Group, Member
from weave_slurm.placement.group import colocated_group

CAP = Capacity(4, 8, 1000.0, 1000.0, 16, 16, CostRates(1.0, 2.85))
LONG = simple_profile("long", 100, 40, 1.5)
SHORT = simple_profile("short", 20, 20, 1.2)


def test_turns_survive_the_plans_json_and_an_old_plan_reads_as_one_turn() -> None:
    plan = GroupPlan(2, 1, (MemberPlan(1, (0,)), MemberPlan(2, (1,), 3)))
    assert GroupPlan.from_json(plan.to_json()) == plan
    raw = json.loads(plan.to_json())
    assert "turns" not in raw["members"][0]   # one turn: the plan as weaved wrote it before
    raw["members"][1].pop("turns")
    assert GroupPlan.from_json(json.dumps(raw)).members[1].turns == 1


def test_placement_sees_a_stored_groups_turns_again(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    ids = [store.add_job(uid=1000, user="alice", name=p.job_id, **stored(p.job_id),
                         source=f"{p.job_id}.toml", profile=p, now=1.0) for p in (LONG, SHORT)]
    group = Group(1, (Member(LONG.with_id(str(ids[0])), (0,)),
                      Member(SHORT.with_id(str(ids[1])), (1,), 3)), 2, 1)
    plan = membership.plan_of(group)
    assert [m.turns for m in plan.members] == [1, 3]
    store.commit_placement([(1, "1", plan, True)], [(ids[0], 1, "new group"),
                                                    (ids[1], 1, "joined")], 2.0)
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 2)
    (rebuilt,) = state.groups
    assert rebuilt.turns == (1, 3)
    assert rebuilt.schedule.period_s == group.schedule.period_s


def test_a_colocated_plan_survives_its_json_and_an_old_plan_reads_as_disaggregated() -> None:
    plan = membership.plan_of(colocated_group(3, SHORT.with_id("7")))
    assert plan == GroupPlan(0, 1, (MemberPlan(7, ()),), colocated=True)
    assert GroupPlan.from_json(plan.to_json()) == plan
    assert plan.without({8}).colocated and plan.without({7}).members == ()
    raw = json.loads(GroupPlan(1, 1, (MemberPlan(1, (0,)),)).to_json())
    assert "colocated" not in raw   # the plan as weaved wrote it before
    assert not GroupPlan.from_json(json.dumps(raw)).colocated
