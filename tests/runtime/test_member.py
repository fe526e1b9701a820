"""The member's recovery budget (pure logic): its own faults are counted, a node's are
waited out for ``node_wait_s``; the backoff doubles up to its cap."""

from __future__ import annotations

from pathlib import Path

from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import MemberSpec, NodeRef
from weave_slurm.runtime.member import RunnerConfig, RunningMember
from weave_slurm.vocab import Pool

CFG = RunnerConfig(max_recoveries=2, recovery_backoff_s=1.0, recovery_backoff_max_s=5.0,
                     node_wait_s=60.0)


def member() -> RunningMember:
    train = NodeRef("h800-0", Pool.TRAIN, Path("/nonexistent/t.sock"))
    rollout = NodeRef("h20-0", Pool.ROLLOUT, Path("/nonexistent/r.sock"))
    return RunningMember(MemberSpec("1"), JobRef("1", 0), train, (rollout,))


def test_own_faults_spend_the_budget() -> None:
    m = member()
    for _ in range(2):
        m.charge(node_fault=False, now=0.0)
        assert m.given_up(CFG, now=0.0) is None
    m.error = "rollout on h20-0 killed"
    m.charge(node_fault=False, now=0.0)
    assert m.given_up(CFG, now=0.0) == "gave up after 3 failures: rollout on h20-0 killed"


def test_node_faults_cost_nothing_until_the_wait_runs_out() -> None:
    m = member()
    m.error = "node h20-0: daemon is gone"
    for t in range(0, 60, 5):            # many node faults within the wait
        m.charge(node_fault=True, now=float(t))
        assert m.given_up(CFG, now=float(t)) is None
    assert m.faults == 0 and m.node_fault_since == 0.0
    assert m.given_up(CFG, now=61.0) == ("gave up after waiting 60 s for an unavailable "
                                         "node: node h20-0: daemon is gone")


def test_an_own_fault_ends_the_node_wait() -> None:
    m = member()
    m.charge(node_fault=True, now=0.0)
    m.charge(node_fault=False, now=100.0)
    assert m.node_fault_since is None and m.given_up(CFG, now=100.0) is None
    m.charge(node_fault=True, now=200.0)  # a new wait starts from here
    assert m.given_up(CFG, now=250.0) is None


def test_backoff_doubles_up_to_its_cap() -> None:
    m = member()
    got = []
    for n in range(6):
        m.recoveries = n
        got.append(m.backoff_s(CFG))
    assert got == [1.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_gpus_on_a_node_are_the_layouts() -> None:
    """A member's GPUs on each of its nodes (CUDA_VISIBLE_DEVICES of its processes there):
    its training ranks there; its rollout engines there x GPUs per engine."""
    from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
    from weave_slurm.runtime.group import MemberSpec
    from weave_slurm.vocab import Phase

    spec = MemberSpec("j", layout=MemberLayout(TrainLayout((3, 2)), RolloutLayout(2, (2, 1))))
    assert [spec.gpus_on(Phase.TRAIN, i) for i in (0, 1)] == [3, 2]
    assert [spec.gpus_on(Phase.ROLLOUT, i) for i in (0, 1)] == [4, 2]
    assert MemberSpec("k").gpus_on(Phase.TRAIN) == 1       # no layout: one rank, one engine
