"""Co-located members: a member whose rollout runs on its own training node.

Real node daemons (LocalBackend processes, each with its own store under /dev/shm),
the reference GRPO job, the device switch on (``device_switch = "on"``: the CPU runs
everything but the CUDA calls). What must hold:

- the member ends bit-identical to its solo run, alone (k = 1) and beside a
  disaggregated member that trains on the same node (k = 0);
- nothing crosses the network for it: its weights and batches are already on its node
  (0 bytes, 0 s, no sync span); a k = 1 ring buffer is a local copy on that node;
- one node, one set of GPUs: no two phases on that node overlap, whoever's and of
  whatever role, even with a staleness window (the workers' own timestamps);
- its worker switches the other role out before each phase (``device.<role>``
  scratch segments, ``device_role_switch`` in the phase's result), not the tenancy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fleet import running_fleet
from tests.harness.munged import private_munged
from tests.harness.processes import kill_worker, node_status, worker_pid
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, each_change, leave_all
from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import GroupLayout, MemberSpec, MemberState, NodeRef
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.staleness import VersionLog
from weave_slurm.runtime.timeline import Span
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer
from weave_slurm.vocab import Phase, Pool

STEPS = 3


def _worker_overlaps(spans: Sequence[Span], node: str) -> list[tuple[str, str]]:
    """Pairs of phases on ``node`` whose workers ran at the same time."""
    on = sorted((s for s in spans if s.node == node and s.kind is not Phase.SYNC),
                key=lambda s: s.worker_start_s or s.start_s)
    out = []
    for a, b in itertools.pairwise(on):
        assert a.worker_start_s is not None and b.worker_start_s is not None
        assert a.worker_end_s is not None
        if b.worker_start_s < a.worker_end_s:
            out.append((f"{a.job_id}:{a.kind.value}", f"{b.job_id}:{b.kind.value}"))
    return out


def _last_result(node: NodeRef, job_id: str) -> dict[str, Any]:
    with NodeClient(node.socket_path) as client:
        worker = client.call(Op.PHASE, job=job_id).get("worker") or {}
    return dict(worker.get("result") or {})


def _jobs_on(node: NodeRef) -> set[str]:
    """The jobs registered on ``node``."""
    return {str(j["job"]) for j in node_status(node.socket_path)["jobs"]}


def _segments(node: NodeRef, job_id: str) -> dict[str, int]:
    """The job's segments on ``node`` and their sizes."""
    with NodeClient(node.socket_path) as client:
        segs = client.call(Op.ATTACH_INFO, job=job_id)["segments"]
    return {k: int(v["index"]["size_bytes"]) for k, v in segs.items()}


def _beside(layout: GroupLayout, tag: str, seed: int
            ) -> tuple[GroupRunner, MemberSpec, MemberSpec]:
    """A runner of a co-located member and a disaggregated one (pinned to rollout node
    0), both training on training node 0, the device switch on."""
    co = MemberSpec(f"co{tag}", seed=seed, steps=STEPS, options=OPTIONS, rollout_pins=(),
                    colocated=True)
    dis = MemberSpec(f"dis{tag}", seed=seed + 1, steps=STEPS, options=OPTIONS)
    return GroupRunner(layout, [co, dis], config=RunnerConfig(device_switch="on")), co, dis


@pytest.mark.torch
def test_colocated_beside_a_disaggregated_member_both_match_solo(local_fleet: Any) -> None:
    layout: GroupLayout = local_fleet.layout
    train = layout.train[0]
    ex, co, dis = _beside(layout, "0", 31)
    try:
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in (co, dis)] == [MemberState.DONE] * 2, \
            ex.status()
        for spec in (co, dis):
            assert_same_as_solo(ex, spec)
        rolls = [s for s in ex.spans if s.job_id == "co0" and s.kind is Phase.ROLLOUT]
        assert len(rolls) == STEPS
        assert {(s.node, s.pool) for s in rolls} == {(train.name, Pool.TRAIN)}
        assert {s.node for s in ex.spans if s.job_id == "dis0" and s.kind is Phase.ROLLOUT} \
            == {layout.rollout[0].name}
        # one node, one set of GPUs: co0's two roles and dis0's training, one at a time
        assert _worker_overlaps(ex.spans, train.name) == []
        # nothing moved for co0, and its profile says so; dis0's weights crossed
        prof = ex.profiler.snapshot()
        assert prof["co0"].sync_bytes == {"weights": 0, "trajectories": 0}
        assert prof["co0"].sync_s and set(prof["co0"].sync_s) == {0.0}
        assert not [s for s in ex.spans if s.job_id == "co0" and s.kind is Phase.SYNC]
        assert prof["dis0"].sync_bytes["weights"] > 0
        assert prof["dis0"].sync_bytes["trajectories"] > 0
        # registered once on its one node, and never on the rollout node
        assert ex.lifecycle.nodes_in_use() >= {train.name}
        assert "co0" in _jobs_on(train) and "dis0" in _jobs_on(layout.rollout[0])
        assert "co0" not in _jobs_on(layout.rollout[0])
    finally:
        leave_all(ex, [co, dis])


@pytest.mark.torch
def test_colocated_k1_alone_serialises_its_roles_and_matches_solo(local_fleet: Any,
                                                                  tmp_path: Path) -> None:
    train = local_fleet.layout.train[0]
    layout = GroupLayout((), (train,))       # a co-located group: no rollout node
    spec = MemberSpec("co1", seed=33, steps=STEPS + 1, options=OPTIONS, rollout_pins=(),
                      colocated=True, staleness=1)
    before = int(node_status(train.socket_path)["device"]["switched"])
    ex = GroupRunner(layout, [spec], config=RunnerConfig(device_switch="on",
                                                         records_dir=tmp_path))
    try:
        ex.run(timeout_s=300)
        assert ex.members["co1"].state is MemberState.DONE, ex.status()
        assert_same_as_solo(ex, spec)                 # against a solo k = 1 run
        log = VersionLog.load(tmp_path / "co1.versions.jsonl")
        assert [r.weights_version for r in log] == [max(0, m - 1) for m in range(STEPS + 1)]
        # the window would let a rollout run beside the training step: not on one node
        assert _worker_overlaps(ex.spans, train.name) == []
        # its ring buffers are local copies on its node (one per version), its batches
        # stay where they are
        prof = ex.profiler.snapshot()["co1"]
        versions = STEPS + 1 + 1                      # init (v0) and every step
        weights = prof.rollout_state_bytes        # the tensors' bytes; a segment pads
        assert versions * weights <= prof.sync_bytes["weights"] <= versions * (weights + 4096)
        assert prof.sync_bytes["trajectories"] == 0
        syncs = [s for s in ex.spans if s.kind is Phase.SYNC]
        assert len(syncs) == versions and {s.node for s in syncs} == {train.name}
        # the role switch is the worker's (no other tenant here: the tenancy moved
        # nothing): each rollout moved the training state (policy, reference, Adam)
        # into device.train; the last phase (a training step) switched the rollout
        # role out, which on CPU holds nothing of its own (its policy borrows the shm
        # weights), so 0 bytes moved there
        assert int(node_status(train.socket_path)["device"]["switched"]) == before
        scratch = _segments(train, "co1")
        assert set(scratch) >= {"device.train", "device.rollout"}
        assert scratch["device.train"] > 2 * weights
        moved = _last_result(train, "co1")["device_role_switch"]["switches"]
        assert [(s["role"], s["moved_bytes"]) for s in moved] == [("rollout", 0)]
    finally:
        leave_all(ex, [spec])


@pytest.mark.torch
def test_colocated_worker_killed_mid_rollout_recovers_to_its_solo_weights(
        local_fleet: Any) -> None:
    """Its one worker holds both roles: a SIGKILL in its rollout (or the training step
    right after it) loses both, recovery restores its checkpoint on its node and it
    still ends as alone; the other member training on that node is untouched. Leaving
    drops it from its one node."""
    layout: GroupLayout = local_fleet.layout
    train = layout.train[0]
    ex, co, dis = _beside(layout, "3", 35)
    killed: list[int] = []

    def kill_mid_rollout(member: RunningMember, change: MemberChanged) -> None:
        if member.spec.job_id == "co3" and member.state is change.state is MemberState.ROLLOUT \
                and member.version == 2 and not killed:
            killed.append(kill_worker(train.socket_path, "co3"))

    try:
        ex.run(timeout_s=300, on_tick=each_change(ex, kill_mid_rollout))
        assert killed, "the test never killed the worker"
        assert [ex.members[s.job_id].state for s in (co, dis)] == [MemberState.DONE] * 2
        assert (ex.members["co3"].recoveries, ex.members["dis3"].recoveries) == (1, 0)
        failed = [s for s in ex.spans if not s.ok]
        # the kill is sent once the member is seen in its rollout; a tiny rollout may
        # have ended by then, and the one worker is in the training step that follows
        assert [(s.job_id, s.node) for s in failed] == [("co3", train.name)]
        assert failed[0].kind in (Phase.ROLLOUT, Phase.TRAIN), failed
        for spec in (co, dis):
            assert_same_as_solo(ex, spec)
        assert GroupPort(ex).members["co3"].colocated
    finally:
        leave_all(ex, [co, dis])
    assert worker_pid(train.socket_path, "co3") is None
    assert "co3" not in _jobs_on(train)


@pytest.fixture(scope="module")
def remote_train(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeRef, Path]]:
    """A training node daemon reached as another host (TCP, munge), and munge's socket."""
    with private_munged() as sock, \
            running_fleet(tmp_path_factory.mktemp("colo"), "co", "weave-test-co-",
                          munge_socket=str(sock)) as fleet:
        assert fleet.layout is not None
        yield fleet.layout.train[0], sock


@pytest.mark.torch
def test_colocated_on_a_remote_host_starts_no_sync_agent(
        remote_train: tuple[NodeRef, Path]) -> None:
    """As on a separate host (the ``twotier`` transfer): nothing crosses to another
    host, so no sync agent is started; its ring buffers are its node daemon's own copy."""
    train, munge = remote_train
    assert train.remote
    spec = MemberSpec("co2", seed=34, steps=STEPS, options=OPTIONS, rollout_pins=(),
                      colocated=True, staleness=1)
    ex = GroupRunner(GroupLayout((), (train,)), [spec], config=RunnerConfig(
        weight_transfer=WeightTransferKind.AUTO, sync_timeout_s=30.0,
        munge_socket=str(munge)))
    transfer = ex.transfer
    assert isinstance(transfer, TwoTierTransfer) and not transfer.local
    copies: list[str] = []
    real_call = ex.link.call

    def counted(node: NodeRef, op: Op, **args: Any) -> dict[str, Any]:
        if op is Op.COPY:
            copies.append(str(args["as_name"]))
        return real_call(node, op, **args)

    transfer.call = counted
    try:
        ex.run(timeout_s=300)
        assert ex.members["co2"].state is MemberState.DONE, ex.status()
        assert_same_as_solo(ex, spec)
        assert transfer.agents is None and not transfer.records
        assert len(copies) == STEPS + 1 and set(copies) == {"weights.b0", "weights.b1"}
        assert ex.profiler.snapshot()["co2"].sync_bytes["trajectories"] == 0
    finally:
        leave_all(ex, [spec])


# -- values: what a co-located member and a layout may say ------------------------------
def _node(name: str, pool: Pool) -> NodeRef:
    return NodeRef(name, pool, Path(f"/nowhere/{name}.sock"))


def test_colocated_member_rolls_out_on_its_training_node() -> None:
    layout = GroupLayout((_node("h20-0", Pool.ROLLOUT),),
                         (_node("h800-0", Pool.TRAIN), _node("h800-1", Pool.TRAIN)))
    spec = MemberSpec("c", train_nodes=(1,), rollout_pins=(), colocated=True)
    spec.validate(1, 2)
    assert spec.rollout_nodes_in(layout) == (layout.train[1],)
    assert MemberSpec("d").rollout_nodes_in(layout) == (layout.rollout[0],)


@pytest.mark.parametrize(("spec", "rollout", "words"), [
    (MemberSpec("c", colocated=True), 1, r"co-located, with rollout_pins=\[0\].*valid: "
                                         r"rollout_pins=\(\)"),
    (MemberSpec("d"), 0, r"the group has no rollout nodes; valid: colocated=true"),
    (MemberSpec("d", rollout_pins=()), 1, r"rollout_pins is empty.*colocated=true"),
])
def test_bad_colocation_is_refused_in_one_line(spec: MemberSpec, rollout: int,
                                              words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        spec.validate(rollout, 1)


def test_a_node_in_both_pools_is_refused() -> None:
    with pytest.raises(ConfigError, match="h800-0 in both pools"):
        GroupLayout((_node("h800-0", Pool.ROLLOUT),), (_node("h800-0", Pool.TRAIN),)).validate()
    GroupLayout((), (_node("h800-0", Pool.TRAIN),)).validate()   # co-located only: fine


def test_colocated_member_is_not_re_pinned() -> None:
    layout = GroupLayout((_node("h20-0", Pool.ROLLOUT),), (_node("h800-0", Pool.TRAIN),))
    ex = GroupRunner(layout, [MemberSpec("c", rollout_pins=(), colocated=True)])
    try:
        with pytest.raises(ConfigError, match=r"'c'.*co-located.*h800-0"):
            ex.relayout.repin(ex.members["c"], (0,))
        ex.extend([_node("h20-1", Pool.ROLLOUT)])      # its node is no rollout node
        assert ex.members["c"].rollout_nodes == (layout.train[0],)
        assert ex.members["c"].spec.rollout_pins == ()
    finally:
        ex.close()


@pytest.mark.parametrize(("lay", "words"), [
    (MemberLayout(TrainLayout((2,)), RolloutLayout(1, (1,))), "with 2 training ranks"),
    (MemberLayout(TrainLayout((1,)), RolloutLayout(1, (2,))), "with 2 rollout engines"),
])
def test_colocated_gang_is_refused_at_join(lay: MemberLayout, words: str) -> None:
    layout = GroupLayout((), (_node("h800-0", Pool.TRAIN),))
    spec = MemberSpec("c", rollout_pins=(), colocated=True, layout=lay)
    with pytest.raises(ConfigError, match=f"'c': co-located {words}: not supported yet"):
        GroupRunner(layout, [spec], config=RunnerConfig(gangs=True))
    GroupRunner(layout, [spec], config=RunnerConfig(gangs=False)).close()   # one process


def test_a_re_pin_its_spec_refuses_is_a_warning_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """weaved re-asks its plan's re-pin every tick: one the member's spec refuses (here a
    pool that does not match its pins) leaves it where it is, as its warning (its
    REASON), and the same refusal is not logged again."""
    layout = GroupLayout((_node("h20-0", Pool.ROLLOUT), _node("h20-1", Pool.ROLLOUT)),
                         (_node("h800-0", Pool.TRAIN),))
    ex = GroupRunner(layout, [MemberSpec("p", rollout_pins=(0,))])
    try:
        member = ex.members["p"]
        for _ in range(3):
            ex.relayout.repin(member, (0, 1), (4,))
        assert member.warning is not None and member.warning.startswith(
            "its plan's re-pin to rollout nodes [0, 1] was refused: ")
        assert sum("was refused" in r.getMessage() for r in caplog.records) == 1
        assert member.repin is None and member.rollout_nodes == (layout.rollout[0],)
    finally:
        ex.close()
