"""Long-tail migration on real node daemons (LocalBackend): bit-identity, overlap, failures.

The members run the reference job's long-tailed variant (``response_len_max``): a
rollout's last requests decode long after the bulk, the executor frees the rollout
node when a quarter of them is left and starts the next member's rollout beside the
tail.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from tests.harness.processes import kill_worker, worker_pid
from tests.runtime.helpers import assert_same_as_solo, leave_all
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.entry import start_job
from weave_slurm.workloads.tasks import EOS_ACTION, DigitTask, TaskKind, length_caps

pytestmark = pytest.mark.torch

#: Long-tailed reference job, small enough for a shared 2-core machine.
LONG = {"prompts_per_step": 4, "group_size": 8, "minibatches": 1, "response_len_max": 64,
        "length_tail_alpha": 1.0}
STEPS = 3
MIGRATE = RunnerConfig(long_tail_migration=True, tail_fraction=0.25, progress_poll_s=0.0)


def _specs(n: int, prefix: str) -> list[MemberSpec]:
    return [MemberSpec(f"{prefix}{i}", seed=21 + i, steps=STEPS, options=LONG)
            for i in range(n)]


def _overlaps(spans: list[Span], job_id: str, node: str, at_s: float) -> list[Span]:
    """Rollouts of other members on ``node`` that started during ``job_id``'s tail."""
    mine = [s for s in spans if s.job_id == job_id and s.kind is Phase.ROLLOUT
            and s.node == node and s.start_s <= at_s <= s.end_s]
    return [s for s in spans if s.kind is Phase.ROLLOUT and s.node == node
            and s.job_id != job_id and mine and at_s <= s.start_s < mine[0].end_s]


# -- the job's long-tailed variant (no daemons) ---------------------------------------
def test_length_caps_are_deterministic_and_heavy_tailed() -> None:
    a = length_caps(3, 7, 4000, 5, 200, 1.0)
    assert torch.equal(a, length_caps(3, 7, 4000, 5, 200, 1.0))
    assert torch.equal(a[:10], length_caps(3, 7, 10, 5, 200, 1.0))   # per request
    assert not torch.equal(a, length_caps(3, 8, 4000, 5, 200, 1.0))
    assert int(a.min()) >= 5 and int(a.max()) == 200
    # Pareto(alpha=1): P(cap > 4 x base) = 1/4; the median stays near 2 x base
    assert 0.2 < float((a > 20).float().mean()) < 0.3
    assert 8 <= float(a.float().median()) <= 12


def test_long_tail_rollout_shrinks_and_reports_progress() -> None:
    ctx = JobContext("lt", Role.ROLLOUT, 5, LONG)
    seen: list[tuple[int, int]] = []
    batch = start_job("builtin:grpo-toy", ctx).rollout(0, lambda r, n: seen.append((r, n)))
    again = start_job("builtin:grpo-toy", ctx).rollout(0)
    t = batch.trajectories.tensors
    for k, v in t.items():
        assert torch.equal(v, again.trajectories.tensors[k]), k   # progress changes nothing
    lengths = t["lengths"]
    assert t["responses"].shape == (32, int(lengths.max()))
    assert int(lengths.max()) > 3 * float(lengths.float().median())   # a long tail
    remaining = [r for r, _ in seen]
    assert remaining[0] == 32 and remaining[-1] == 0 and remaining == sorted(remaining)[::-1]
    assert {n for _, n in seen} == {32}


def test_reward_of_ended_responses() -> None:
    task = DigitTask(TaskKind.COPY, 3)
    prompts = torch.tensor([[1, 2, 3]] * 4)
    e = EOS_ACTION
    responses = torch.tensor([[1, 2, 3, e, 0],     # right digits, ended in place: 4/4
                              [1, 2, 3, 4, e],     # right digits, one too many: 3/4
                              [1, e, 0, 0, 0],     # stopped early: 1/4
                              [9, 2, 3, e, 0]])    # one digit wrong, ended: 3/4
    lengths = torch.tensor([4, 5, 2, 4])
    got = task.reward_ended(prompts, responses, lengths)
    assert got.tolist() == [1.0, 0.75, 0.25, 0.75]


def test_long_tail_batch_trains() -> None:
    train = start_job("builtin:grpo-toy", JobContext("lt", Role.TRAIN, 5, LONG))
    roll = start_job("builtin:grpo-toy", JobContext("lt", Role.ROLLOUT, 5, LONG))
    before = train.export_weights()
    assert train.train(roll.rollout(0)) == 1
    after = train.export_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(torch.tensor(v)) for v in train.last_train_metrics.values())


def test_long_tail_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="response_len_max"):
        start_job("builtin:grpo-toy", JobContext("x", Role.ROLLOUT, 0,
                                                 {"response_len_max": 3}))
    with pytest.raises(ConfigError, match="length_tail_alpha"):
        start_job("builtin:grpo-toy", JobContext("x", Role.ROLLOUT, 0,
                                                 {"response_len_max": 9,
                                                  "length_tail_alpha": 0.0}))
    with pytest.raises(ConfigError, match="tail_fraction"):
        RunnerConfig(long_tail_migration=True, tail_fraction=1.5)


# -- in a group ------------------------------------------------------------------------
def test_migration_overlaps_tails_and_matches_solo(local_fleet: object) -> None:
    specs = _specs(2, "lt")
    ex = GroupRunner(local_fleet.layout, specs, config=MIGRATE)  # type: ignore[attr-defined]
    try:
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        for spec in specs:
            assert_same_as_solo(ex, spec)
        assert ex.tail_moves, "no rollout ever reached its tail"
        for move in ex.tail_moves:
            assert 0 < move.remaining <= 0.25 * move.total
        # the evidence: a migrated tail ran beside the next member's rollout, same node
        overlapped = [m for m in ex.tail_moves
                      if _overlaps(ex.spans, m.job_id, m.node, m.at_s)]
        assert overlapped, f"no rollout started during a tail: {ex.tail_moves}"
        # at most one tail per node: a tail is declared only after the previous one ended
        ends = {(s.job_id, s.node, s.start_s): s.end_s for s in ex.spans
                if s.kind is Phase.ROLLOUT}
        moves = sorted(ex.tail_moves, key=lambda m: m.at_s)
        for prev, nxt in itertools.pairwise(moves):
            prev_end = min(e for (j, n, t), e in ends.items()
                           if j == prev.job_id and n == prev.node and t <= prev.at_s <= e)
            assert prev_end <= nxt.at_s, f"two tails at once on {nxt.node}: {prev}, {nxt}"
        # on-policy barrier per member unchanged
        for spec in specs:
            kinds = [s.kind for s in sorted(ex.spans, key=lambda s: s.start_s)
                     if s.job_id == spec.job_id and s.kind is not Phase.SYNC]
            assert kinds == [Phase.TRAIN] + [Phase.ROLLOUT, Phase.TRAIN] * STEPS
    finally:
        leave_all(ex, specs)


def test_without_migration_rollouts_never_overlap(local_fleet: object) -> None:
    specs = _specs(2, "ln")
    ex = GroupRunner(local_fleet.layout, specs)  # type: ignore[attr-defined]
    try:
        ex.run(timeout_s=300)
        assert ex.tail_moves == []
        rolls = sorted((s for s in ex.spans if s.kind is Phase.ROLLOUT),
                       key=lambda s: s.start_s)
        assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(rolls))
        for spec in specs:
            assert_same_as_solo(ex, spec)
    finally:
        leave_all(ex, specs)


@pytest.mark.parametrize("how", ["cancel", "kill"])
def test_member_lost_in_its_tail_breaks_nothing(local_fleet: object, how: str) -> None:
    specs = _specs(2, f"lx{how[0]}")
    victim, other = specs[0].job_id, specs[1].job_id
    ex = GroupRunner(local_fleet.layout, specs, config=MIGRATE)  # type: ignore[attr-defined]
    hit: list[str] = []

    def strike(executor: GroupRunner) -> None:
        m = executor.members[victim]
        run = m.runs.get(Phase.ROLLOUT)
        if hit or run is None or run.tail_s is None or run.ended:
            return
        assert m.status_row()["tail"] is True
        if how == "cancel":
            GroupPort(executor).apply(Leave(victim))
        else:
            kill_worker(run.node.socket_path, victim)
        hit.append(run.node.name)

    try:
        ex.run(timeout_s=300, on_tick=strike)
        assert hit, "the victim's rollout never reached its tail"
        assert ex.members[other].state is MemberState.DONE
        assert_same_as_solo(ex, specs[1])
        assert ex.slots.tails == {} and ex.slots.busy == {}   # no node left marked
        if how == "cancel":
            assert ex.members[victim].state is MemberState.CANCELLED
            assert worker_pid(ex.layout.rollout[0].socket_path, victim) is None
            node_dir = [p for p in Path("/dev/shm").glob(f"weave-test-rt-*/**/{victim}")]
            assert node_dir == []
        else:
            assert ex.members[victim].state is MemberState.DONE
            assert ex.members[victim].recoveries == 1
            assert any(not s.ok and s.job_id == victim for s in ex.spans)
            assert_same_as_solo(ex, specs[0])
    finally:
        leave_all(ex, specs)
