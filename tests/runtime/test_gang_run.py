"""Training gangs in a group on local node daemons: each rank a resident worker of its
own node's daemon, one gloo world per member kept across phases.

Three members on 2 training and 2 rollout nodes: ``wide`` trains as 2 nodes x 2 ranks,
``pair`` as 1 node x 2 ranks (on the second node), ``duo`` as a single rank (on the
first) and rolls out as 2 engines, one on each rollout node. Each must end
bit-identical to a solo run of the same layout; a SIGKILL of one rank of ``wide``
mid-train forms its gang again from its per-rank checkpoints while the others go on; a
member that leaves leaves no rank process and no segment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.processes import node_status, pid_alive
from tests.harness.solo import run_solo
from tests.harness.solo_gang import run_solo_gang
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import group_weights, kill_once, leave_all, worker_pids
from weave_slurm.hosted.contract import rank_job
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.runtime.faults import FaultKind
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.vocab import Phase

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STEPS = 3


@pytest.fixture(scope="module")
def gang_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """Two rollout node daemons and two training node daemons, local processes."""
    with running_fleet(tmp_path_factory.mktemp("gang"), "gang", "weave-test-gang-",
                       rollout_nodes=2, train_nodes=2) as fleet:
        yield fleet


def _layout(*ranks_per_node: int, engines: tuple[int, ...] = (1,)) -> MemberLayout:
    return MemberLayout(TrainLayout(tuple(ranks_per_node)), RolloutLayout(1, engines))


def _specs(steps: int = STEPS) -> list[MemberSpec]:
    return [MemberSpec("wide", seed=31, steps=steps, options=OPTIONS, train_nodes=(0, 1),
                       layout=_layout(2, 2)),
            MemberSpec("pair", seed=32, steps=steps, options=OPTIONS, train_nodes=(1,),
                       layout=_layout(2)),
            MemberSpec("duo", seed=33, steps=steps, options={**OPTIONS, "sampling": "per_prompt"},
                       train_nodes=(0,), rollout_pins=(0, 1), layout=_layout(1, engines=(1, 1)))]


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    assert sorted(got) == sorted(want)
    return [k for k, v in want.items() if not torch.equal(got[k], v)]


def _all_gone(pids: dict[str, int], timeout_s: float = 10.0) -> list[str]:
    """The workers of ``pids`` still alive after ``timeout_s`` (their drop kills them)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(pid_alive(p) for p in pids.values()):
        time.sleep(0.1)
    return [k for k, p in pids.items() if pid_alive(p)]


def test_gangs_of_three_layouts_match_their_solo_runs(gang_fleet: NodeFleet) -> None:
    specs = _specs()
    ex = GroupRunner(gang_fleet.layout, specs)  # type: ignore[arg-type]
    try:
        gangs = {s.job_id: ex.members[s.job_id].gang for s in specs}
        assert {j: g.size for j, g in gangs.items() if g} == {"wide": 4, "pair": 2, "duo": 1}
        engines = ex.members["duo"].engines
        assert engines is not None and [(s.node.name, s.job.job_id) for s in engines.slots] \
            == [("h20-0", "duo"), ("h20-1", "duo.e1")]
        assert ex.members["wide"].engines is None
        ex.run(timeout_s=420)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3
        for spec in specs:
            solo = run_solo_gang(spec)
            assert _same(group_weights(ex, spec.job_id), solo.weights) == [], spec.job_id
            assert tuple(ex.members[spec.job_id].rewards) == solo.rewards
        # both engines rolled out every step, each on its own node (its node-level job)
        rolled = {s.node for s in ex.spans if s.job_id == "duo" and s.kind is Phase.ROLLOUT}
        assert rolled == {"h20-0"}   # a rollout gang's phase is its engine 0's span ...
        rollout = gang_fleet.layout.rollout  # type: ignore[union-attr]
        for ref, part in zip(rollout, ("traj.e0", "traj.e1"), strict=True):   # ... each
            rows = {j["job"]: j for j in node_status(ref.socket_path)["jobs"]}  # put its own
            assert part in rows["duo"]["segments"], (ref.name, rows["duo"]["segments"])
        assert "duo.e1" in {j["job"] for j in node_status(rollout[1].socket_path)["jobs"]}
        # a gang's result is its own: one rank of the same job ends elsewhere (float
        # reduction order), so the match above is with the gang, not with rank 0 alone
        single = run_solo(MemberSpec("wide", seed=31, steps=STEPS, options=OPTIONS))
        assert _same(group_weights(ex, "wide"), single.weights) != []
        # each rank keeps its own shard of the state on its own node (a quarter of it)
        wide = ex.members["wide"].gang
        assert wide is not None
        assert [s.node.name for s in wide.slots] == ["h800-0", "h800-0", "h800-1", "h800-1"]
        nbytes = []
        for slot in wide.slots:
            rows = node_status(slot.node.socket_path)["jobs"]
            row = next(j for j in rows if j["job"] == slot.job.job_id)
            nbytes.append(row["segments"]["state"]["size_bytes"])
        assert max(nbytes) <= 1.2 * min(nbytes), nbytes
        # the world was formed once and kept: every training phase after the first is warm
        assert wide.formations == 1
        running = {k: v for j in ("wide", "pair", "duo")
                   for k, v in worker_pids(gang_fleet, j).items()}
        assert {k.split("/")[1] for k in running} >= {   # every rank's and engine's worker
            "wide", "wide.r1", "wide.r2", "wide.r3", "pair", "pair.r1", "duo", "duo.e1"}
    finally:
        leave_all(ex, specs)
    assert _all_gone(running) == []      # leaving stopped them (they were seen above)
    for job in ("wide", "pair", "duo"):
        assert worker_pids(gang_fleet, job) == {}, job
    left = [p for p in gang_fleet.config.shm_dir.rglob("*")
            if p.name in {rank_job(j, r) for j in ("wide", "pair", "duo") for r in range(4)}
            | {"duo.e1"}]
    assert left == []


def test_a_killed_rank_forms_its_gang_again_and_the_others_go_on(
        gang_fleet: NodeFleet) -> None:
    steps = 4
    specs = _specs(steps)
    ex = GroupRunner(gang_fleet.layout, specs)  # type: ignore[arg-type]
    killed: list[int] = []

    def mid_train(m: RunningMember) -> bool:
        run = m.runs.get(Phase.TRAIN)
        return run is not None and not run.init and m.version >= 1

    try:
        ex.run(timeout_s=600, on_tick=kill_once(gang_fleet, "wide", "h800-1/wide.r3",
                                                mid_train, killed))
        assert killed, "rank 3 of wide was never seen training"
        wide = ex.members["wide"]
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 3, \
            [(s.job_id, ex.members[s.job_id].error) for s in specs]
        assert wide.recoveries >= 1 and wide.fault is not None
        assert wide.fault.kind in (FaultKind.WORKER_KILLED, FaultKind.PHASE_FAILED)
        assert wide.gang is not None and wide.gang.formations >= 2   # a new world
        assert ex.members["pair"].recoveries == ex.members["duo"].recoveries == 0
        for spec in specs:
            solo = run_solo_gang(spec)
            assert _same(group_weights(ex, spec.job_id), solo.weights) == [], spec.job_id
        assert not pid_alive(killed[0])
        running = worker_pids(gang_fleet, "wide")     # the re-formed gang's workers
        assert {k.split("/")[1] for k in running} >= {"wide", "wide.r1", "wide.r2", "wide.r3"}
    finally:
        leave_all(ex, specs)
    assert _all_gone(running) == []
    assert worker_pids(gang_fleet, "wide") == {}


def test_a_gang_rank_state_lives_on_its_own_node(gang_fleet: NodeFleet) -> None:
    """After init, each of pair's 2 ranks holds its own state shard (about half of a
    single rank's bytes) on h800-1 under its own node-level job."""
    specs = _specs(1)[1:2]
    ex = GroupRunner(gang_fleet.layout, specs)  # type: ignore[arg-type]
    try:
        ex.run(timeout_s=300)
        assert ex.members["pair"].state is MemberState.DONE
        node = gang_fleet.layout.train[1]  # type: ignore[union-attr]
        rows = {j["job"]: j for j in node_status(node.socket_path)["jobs"]}
        sizes = {name: rows[name]["segments"]["state"]["size_bytes"]
                 for name in ("pair", "pair.r1")}
        assert all(v > 0 for v in sizes.values()), sizes
        assert abs(sizes["pair"] - sizes["pair.r1"]) <= 0.1 * sizes["pair"], sizes
        assert "weights" in rows["pair"]["segments"]            # rank 0 puts the weights
        assert "weights" not in rows["pair.r1"]["segments"]     # ... rank 1 does not
    finally:
        leave_all(ex, specs)


def test_a_gang_over_two_nodes_sends_its_weights_from_both(gang_fleet: NodeFleet) -> None:
    """With the two-tier sync, ``wide``'s weights leave from both of its training nodes
    (each node's first rank holds them, shared over the gang's world), every sender
    its own share of the streams; ``wide`` and ``duo`` still end as their solo runs."""
    from weave_slurm.config.runtime import WeightTransferKind
    from weave_slurm.runtime.member import RunnerConfig
    from weave_slurm.runtime.twotier_transfer import TwoTierTransfer

    specs = [_specs()[0], _specs()[2]]
    config = RunnerConfig(weight_transfer=WeightTransferKind.TWOTIER, sync_mode="delta",
                          sync_timeout_s=30.0)
    ex = GroupRunner(gang_fleet.layout, specs, config=config)  # type: ignore[arg-type]
    try:
        assert isinstance(ex.transfer, TwoTierTransfer)
        ex.run(timeout_s=420)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        for spec in specs:
            solo = run_solo_gang(spec)
            assert _same(group_weights(ex, spec.job_id), solo.weights) == [], spec.job_id
        pushes = [r for r in ex.transfer.records if r.job_id == "wide" and r.name == "weights"]
        assert len(pushes) == STEPS + 1      # init and every step
        for rec in pushes:
            sent = {k: int(v.get("slow_link_bytes", 0)) for k, v in rec.replies.items()
                    if k.startswith("train:")}
            assert sorted(sent) == ["train:h800-0", "train:h800-1"], rec.replies
            assert all(b > 0 for b in sent.values()), sent     # both nodes sent
        first = pushes[0]      # a full sync: the two halves make one copy of the weights
        shares = [int(v["slow_link_bytes"]) for k, v in first.replies.items()
                  if k.startswith("train:")]
        assert first.slow_link_bytes == sum(shares) >= first.node_bytes   # 1 rollout node
        assert min(shares) >= 0.4 * sum(shares), shares
        duo = [r for r in ex.transfer.records if r.job_id == "duo" and r.name == "weights"]
        assert duo and all(sorted(k for k in r.replies if k.startswith("train:"))
                           == ["train:h800-0"] for r in duo)   # one node: one sender
    finally:
        leave_all(ex, specs)
