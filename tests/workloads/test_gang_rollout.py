"""A rollout over several engines, and the gang helpers (shares, shards, their assembly).

With ``sampling = "per_prompt"`` every prompt draws from a stream of its own, so E
engines that each generate their share of the prompts make, joined in rank order, the
very batch one engine makes.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, JobRunner, Role, TrajectoryBatch
from weave_slurm.workloads.gang_api import (
    ShardPiece,
    WeightShard,
    assemble_weights,
    chunk_bounds,
    share_bounds,
    whole_shard,
)
from weave_slurm.workloads.grpo_toy import GrpoToyJob

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

PER_PROMPT = {"sampling": "per_prompt", "prompts_per_step": 6, "group_size": 4}
LONG_TAIL = {**PER_PROMPT, "response_len_max": 12}


def _engine(rank: int, world: int, **options: object) -> JobRunner:
    return JobRunner(GrpoToyJob(), JobContext("e", Role.ROLLOUT, 5, dict(options),
                                              rank=rank, world_size=world))


def _engines_batch(world: int, version: int, weights: dict[str, Any] | None,
                   **options: object) -> TrajectoryBatch:
    engines = [_engine(r, world, **options) for r in range(world)]
    if weights is not None:
        for e in engines:
            e.import_weights(weights, version)
    return engines[0].merge_rollouts([e.rollout(version) for e in engines])


def _assert_same_batch(a: TrajectoryBatch, b: TrajectoryBatch) -> None:
    ta, tb = a.trajectories.tensors, b.trajectories.tensors
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert a.metrics == b.metrics and a.weights_version == b.weights_version


@pytest.mark.parametrize("options", [PER_PROMPT, LONG_TAIL], ids=["fixed", "long-tail"])
def test_engines_make_the_single_engine_batch(options: dict[str, object]) -> None:
    one = _engine(0, 1, **options).rollout(0)
    for world in (2, 4):
        parts = [_engine(r, world, **options).rollout(0) for r in range(world)]
        assert [p.trajectories.tensors["prompts"].shape[0] for p in parts] == (
            [12, 12] if world == 2 else [8, 8, 4, 4])   # 6 prompts x 4 samples
        _assert_same_batch(_engine(0, world, **options).merge_rollouts(parts), one)


@pytest.mark.parametrize("options", [PER_PROMPT, LONG_TAIL], ids=["fixed", "long-tail"])
def test_more_engines_than_prompts_make_the_single_engine_batch(
        options: dict[str, object]) -> None:
    """A pool wider than a rollout's prompts (6 prompts, 8 engines): the engines past
    the prompts have no share, return no rows and no metric, and the batch is still
    the one engine's, metrics included."""
    one = _engine(0, 1, **options).rollout(0)
    parts = [_engine(r, 8, **options).rollout(0) for r in range(8)]
    assert [p.trajectories.tensors["prompts"].shape[0] for p in parts] == [4] * 6 + [0] * 2
    assert parts[-1].metrics == {}
    _assert_same_batch(_engine(0, 8, **options).merge_rollouts(parts), one)


def test_engines_with_trained_weights_make_the_single_engine_batch() -> None:
    train = JobRunner(GrpoToyJob(), JobContext("e", Role.TRAIN, 5, dict(PER_PROMPT)))
    train.train(train.rollout(0))
    weights = train.export_weights()
    single = _engines_batch(1, 1, weights, **PER_PROMPT)
    _assert_same_batch(_engines_batch(3, 1, weights, **PER_PROMPT), single)
    # ... and that batch is not the one of the initial weights, nor of the next version
    before = _engines_batch(1, 0, None, **PER_PROMPT).trajectories.tensors["responses"]
    assert not torch.equal(single.trajectories.tensors["responses"], before)
    assert train.train(single) == 2


def test_a_rollout_over_engines_needs_per_prompt_sampling() -> None:
    with pytest.raises(ConfigError, match=r"options.sampling: a rollout over 2 engines needs "
                                          r"'per_prompt' .* got 'batch'"):
        _engine(1, 2)
    with pytest.raises(ConfigError, match=r"options.sampling: unknown value 'engine' "
                                          r"\(valid: batch, per_prompt\)"):
        _engine(0, 1, sampling="engine")


def test_per_prompt_sampling_draws_other_responses_to_the_same_prompts() -> None:
    batch = _engine(0, 1).rollout(0).trajectories.tensors
    per_prompt = _engine(0, 1, sampling="per_prompt").rollout(0).trajectories.tensors
    assert torch.equal(batch["prompts"], per_prompt["prompts"])
    assert not torch.equal(batch["responses"], per_prompt["responses"])


# -- the gang helpers -----------------------------------------------------------------

def test_shares_and_chunks_cover_every_item_once() -> None:
    for n in range(0, 12):
        for world in range(1, 6):
            for bounds in (share_bounds, chunk_bounds):
                spans = [bounds(n, world, r) for r in range(world)]
                assert spans[0][0] == 0 and spans[-1][1] == n
                assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert [share_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [chunk_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [len(c) for c in torch.arange(10).chunk(4)] == [3, 3, 3, 1]
    with pytest.raises(ValueError, match="outside a gang of 2"):
        share_bounds(4, 2, 2)


def _two_shards() -> tuple[dict[str, Any], list[WeightShard]]:
    weights = {"a": torch.arange(12.0).reshape(4, 3), "b": torch.arange(3.0) + 100}
    shards = []
    for rank in range(2):
        lo, hi = chunk_bounds(4, 2, rank)
        parts = [weights["a"][lo:hi].reshape(-1), weights["b"] if rank == 0 else torch.zeros(0)]
        pieces = (ShardPiece("a", (4, 3), lo * 3, 0, (hi - lo) * 3),
                  ShardPiece("b", (3,), 0, (hi - lo) * 3, 3 if rank == 0 else 0))
        shards.append(WeightShard(rank, 2, torch.cat(parts), pieces))
    return weights, shards


def test_weight_shards_assemble_and_travel_as_tensors() -> None:
    weights, shards = _two_shards()
    back = [WeightShard.from_tensors(s.to_tensors()) for s in shards]
    for got in (assemble_weights(shards), assemble_weights(back[::-1])):
        assert got.keys() == weights.keys()
        assert all(torch.equal(got[k], weights[k]) for k in weights)
    whole = whole_shard(weights)
    assert (whole.rank, whole.world_size, whole.flat.numel()) == (0, 1, 15)
    assert all(torch.equal(assemble_weights([whole])[k], weights[k]) for k in weights)


def test_bad_shards_are_refused() -> None:
    _, (s0, s1) = _two_shards()
    with pytest.raises(StateError, match=r"ranks \[0, 0\]"):
        assemble_weights([s0, s0])
    gap = WeightShard(1, 2, s1.flat, (ShardPiece("a", (4, 3), 7, 0, 5), s1.pieces[1]))
    with pytest.raises(StateError, match=r"a: elements 6\.\.7 are missing"):
        assemble_weights([s0, gap])
    overlap = WeightShard(1, 2, s1.flat, (ShardPiece("a", (4, 3), 5, 0, 6), s1.pieces[1]))
    with pytest.raises(StateError, match=r"a: elements 5\.\.6 overlap"):
        assemble_weights([s0, overlap])
    with pytest.raises(StateError, match="one dtype"):
        whole_shard({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.int64)})
