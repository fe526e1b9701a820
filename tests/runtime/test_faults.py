"""Faults are typed values: their kind decides recovery, their words are for people;
and the pure plan for a group that lost nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from weave_slurm.errors import (
    NoCheckpoint,
    NodeGone,
    NodeUnavailable,
    StateError,
    VersionMismatch,
)
from weave_slurm.node.checkpoint import CheckpointStore
from weave_slurm.node.index import JobRef
from weave_slurm.node.segments import SegmentStore
from weave_slurm.runtime.faults import Fault, FaultKind, error_kind
from weave_slurm.runtime.group import MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.resume import ResumeKind, forget_checkpoints, plan_detach
from weave_slurm.sync.sync_errors import AgentDidNotStart, SyncError
from weave_slurm.vocab import Phase, Pool

ROLL = Phase.ROLLOUT


@pytest.mark.parametrize(("fault", "words"), [
    (Fault(FaultKind.WORKER_KILLED, "h20-0", ROLL, -9),
     "worker on node h20-0 killed by signal 9 (SIGKILL) during rollout"),
    (Fault(FaultKind.WORKER_KILLED, "h20-0", ROLL, None),
     "worker on node h20-0 killed during rollout (exit status not known)"),
    (Fault(FaultKind.WORKER_EXITED, "h800-0", Phase.TRAIN, 3),
     "worker on node h800-0 exited with code 3 during train"),
    (Fault(FaultKind.WORKER_EXITED, "h800-0", Phase.TRAIN, None),
     "worker on node h800-0 failed during train (exit status not known)"),
    (Fault(FaultKind.PHASE_FAILED, "h800-0", Phase.TRAIN, 1, "ValueError: nan loss"),
     "train on h800-0 failed: ValueError: nan loss"),
    (Fault(FaultKind.PHASE_HUNG, "h20-0", ROLL, evidence="ran past its deadline of 60.0 s"),
     "rollout on h20-0 hung: ran past its deadline of 60.0 s"),
    (Fault(FaultKind.NODE_GONE, "h20-1", ROLL, evidence="node daemon at 'x' closed the "
           "connection", during="start of"),
     "node daemon on node h20-1 stopped answering (node daemon at 'x' closed the connection)"),
    (Fault(FaultKind.REQUEST_FAILED, "h800-0", Phase.TRAIN, evidence="budget full",
           during="after"), "after train on h800-0: budget full"),
])
def test_words_name_the_worker_or_daemon_what_and_when(fault: Fault, words: str) -> None:
    assert fault.words() == words


@pytest.mark.parametrize(("exc", "kind"), [
    (NodeGone("gone"), FaultKind.NODE_GONE),
    (NodeUnavailable("stopping"), FaultKind.NODE_STOPPING),
    (NoCheckpoint("none"), FaultKind.NO_CHECKPOINT),
    (VersionMismatch("stale"), FaultKind.VERSION_REFUSED),
    (SyncError("peer died"), FaultKind.SYNC_FAILED),
    (AgentDidNotStart("srun: Job step aborted"), FaultKind.STEP_FAILED),
    (StateError("has no checkpoint"), FaultKind.REQUEST_FAILED),   # words never decide
])
def test_an_errors_kind_comes_from_its_type_not_its_words(exc: Exception, kind: FaultKind) -> None:
    assert error_kind(exc) is kind  # type: ignore[arg-type]


def test_only_node_faults_are_free_and_only_kills_and_nodes_restart_a_first_phase() -> None:
    # a sync agent Slurm could not start on its node (its slurmd stopped) is the node's
    # fault: a member in its first phase starts again, it does not fail (issue 33, C1)
    nodes = {FaultKind.NODE_GONE, FaultKind.NODE_STOPPING, FaultKind.STEP_FAILED}
    assert {k for k in FaultKind if k.node_fault} == nodes
    assert {k for k in FaultKind if k.restartable} == {FaultKind.WORKER_KILLED, *nodes}


def _member(job: str, train: NodeRef, roll: NodeRef, state: MemberState,
            initialised: bool) -> RunningMember:
    m = RunningMember(MemberSpec(job), JobRef(job, os.getuid()), train, (roll,), state=state)
    m.initialised = initialised
    return m


def test_a_lost_group_plan_keeps_warm_carries_checkpoints_and_restarts_fresh(
        tmp_path: Path) -> None:
    t0, t1 = NodeRef("h800-0", Pool.TRAIN, Path("t0")), NodeRef("h800-1", Pool.TRAIN, Path("t1"))
    r0 = NodeRef("h20-0", Pool.ROLLOUT, Path("r0"))
    warm = _member("1", t1, r0, MemberState.TRAIN, True)
    carried = _member("2", t0, r0, MemberState.ROLLOUT, True)
    fresh = _member("3", t0, r0, MemberState.STARTING, False)
    lost = _member("4", t0, r0, MemberState.READY, True)
    ended = _member("5", t0, r0, MemberState.DONE, True)
    shm = SegmentStore(tmp_path / "shm")
    shm.put_state(carried.job, "state", {"w": torch.ones(3)}, version=7)
    CheckpointStore(tmp_path / "ckpt" / "h800-0").save(shm, carried.job)

    plan = plan_detach([warm, carried, fresh, lost, ended], [t0], tmp_path / "ckpt")
    assert {k: r.kind for k, r in plan.items()} == {
        "1": ResumeKind.WARM, "2": ResumeKind.CARRIED, "3": ResumeKind.FRESH,
        "4": ResumeKind.FAILED, "5": ResumeKind.ENDED}
    assert plan["2"].root == tmp_path / "ckpt" / "h800-0" and plan["2"].version == 7
    assert plan["1"].readmit == "train node h800-0 lost; re-attached on a new allocation"
    assert "not resumable" in plan["4"].why
    assert plan_detach([carried], [t0], None)["2"].kind is ResumeKind.FAILED  # no shared root


def test_a_done_member_whose_training_node_was_lost_is_carried_to_read_its_weights(
        tmp_path: Path) -> None:
    """It reached its last version, but the node went before weaved read its final
    weights: they come back from its final checkpoint; with none, it ended as it did."""
    t0, t1 = NodeRef("h800-0", Pool.TRAIN, Path("t0")), NodeRef("h800-1", Pool.TRAIN, Path("t1"))
    r0 = NodeRef("h20-0", Pool.ROLLOUT, Path("r0"))
    done, kept = _member("1", t0, r0, MemberState.DONE, True), _member("2", t1, r0,
                                                                     MemberState.DONE, True)
    shm = SegmentStore(tmp_path / "shm")
    shm.put_state(done.job, "state", {"w": torch.ones(3)}, version=3)
    CheckpointStore(tmp_path / "ckpt" / "h800-0").save(shm, done.job)
    plan = plan_detach([done, kept], [t0], tmp_path / "ckpt")
    assert plan["1"].kind is ResumeKind.CARRIED and plan["1"].version == 3
    assert "before its final weights were read" in plan["1"].why
    assert plan["2"].kind is ResumeKind.ENDED          # its training node is still there
    assert plan_detach([done], [t0], None)["1"].kind is ResumeKind.ENDED   # none in reach


def test_a_gang_whose_second_node_was_lost_carries_every_ranks_checkpoint(
        tmp_path: Path) -> None:
    """A gang's state lives on all its training nodes: losing rank 2's node (not rank
    0's) is a lost training node too, and the plan names each rank's old root."""
    from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
    from weave_slurm.runtime.gang import Gang

    t0, t1 = NodeRef("h800-0", Pool.TRAIN, Path("t0")), NodeRef("h800-1", Pool.TRAIN, Path("t1"))
    r0 = NodeRef("h20-0", Pool.ROLLOUT, Path("r0"))
    spec = MemberSpec("g", train_nodes=(0, 1),
                      layout=MemberLayout(TrainLayout((2, 2)), RolloutLayout(1, (1,))))
    m = RunningMember(spec, JobRef("g", os.getuid()), t0, (r0,), state=MemberState.READY)
    m.initialised = True
    m.gang = Gang.of(spec, m.job, (t0, t1))
    shm = SegmentStore(tmp_path / "shm")
    shm.put_state(m.job, "state", {"w": torch.ones(3)}, version=4)
    CheckpointStore(tmp_path / "ckpt" / "h800-0").save(shm, m.job)
    plan = plan_detach([m], [t1], tmp_path / "ckpt")["g"]
    assert plan.kind is ResumeKind.CARRIED and plan.version == 4
    base = tmp_path / "ckpt"
    assert plan.rank_roots == (base / "h800-0", base / "h800-1", base / "h800-1")
    m.gang = Gang.of(spec, m.job, (t0, t1), whole=False)     # one rank: h800-1 is not its
    assert plan_detach([m], [t1], base)["g"].kind is ResumeKind.WARM


def test_a_member_that_ends_as_its_training_node_goes_leaves_no_checkpoint_there(
        tmp_path: Path) -> None:
    """A member that ended just as its training node was lost: the node cannot drop its
    checkpoints, so weaved removes them from that node's root on the shared file system
    (``forget_checkpoints``, called by ``Lifecycle.leave``); another job's stay."""
    t0, r0 = NodeRef("h800-0", Pool.TRAIN, Path("t0")), NodeRef("h20-0", Pool.ROLLOUT, Path("r0"))
    done, other = _member("1", t0, r0, MemberState.DONE, True), _member("2", t0, r0,
                                                                        MemberState.READY, True)
    shm = SegmentStore(tmp_path / "shm")
    root = CheckpointStore(tmp_path / "ckpt" / "h800-0")
    for m in (done, other):
        shm.put_state(m.job, "state", {"w": torch.ones(3)}, version=4)
        root.save(shm, m.job)
    assert forget_checkpoints(done, tmp_path / "ckpt", [t0]) == [tmp_path / "ckpt" / "h800-0"]
    assert not root.job_dir(done.job).exists() and root.checkpoints(other.job)
    assert forget_checkpoints(done, tmp_path / "ckpt", [t0]) == []   # nothing left
    assert forget_checkpoints(other, None, [t0]) == [] and root.checkpoints(other.job)
