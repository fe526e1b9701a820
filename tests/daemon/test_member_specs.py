"""A stored job as the runtime runs it (daemon/member_specs.py): a co-located one."""

from __future__ import annotations

from pathlib import Path

from tests.harness.specs import stored
from weave_slurm.daemon import membership
from weave_slurm.daemon.member_specs import member_spec
from weave_slurm.daemon.store import Store
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Group, Member
from weave_slurm.placement.group import colocated_group

JOB = simple_profile("j", 20, 20, 1.2)


def test_a_member_of_a_colocated_group_rolls_out_on_its_training_node(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    ids = [store.add_job(uid=1000, user="alice", name=f"j{i}", **stored(f"j{i}"),
                         source=f"j{i}.toml", profile=JOB, now=1.0) for i in range(2)]
    colo = membership.plan_of(colocated_group(1, JOB.with_id(str(ids[0]))))
    apart = membership.plan_of(Group(2, (Member(JOB.with_id(str(ids[1])), (0,)),), 1, 1))
    store.commit_placement([(1, "1", colo, True), (2, "2", apart, True)],
                           [(ids[0], 1, "colocated"), (ids[1], 2, "new group")], 2.0)
    rows = {g.group_id: g for g in store.groups()}
    jobs = {j.job_id: j for j in store.jobs()}
    spec = member_spec(jobs[ids[0]], rows[1])
    assert spec.colocated and spec.rollout_pins == () and spec.train_nodes == (0,)
    spec.validate(0, 1)   # a group of co-located members alone: no rollout node
    other = member_spec(jobs[ids[1]], rows[2])
    assert not other.colocated and other.rollout_pins == (0,)
