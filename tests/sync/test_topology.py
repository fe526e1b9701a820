"""Topology from allocations and the pure stage-1 stream plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_slurm.errors import ConfigError
from weave_slurm.sync.topology import (
    ALIGN_BYTES,
    PoolNodes,
    ShardLayout,
    build_topology,
    plan_streams,
)
from weave_slurm.vocab import Pool


def _topo(n_train: int, n_rollout: int, nodes: int = 1):  # type: ignore[no-untyped-def]
    specs = []
    for pool, n in ((Pool.TRAIN, n_train), (Pool.ROLLOUT, n_rollout)):
        k = min(nodes, n)
        specs += [PoolNodes(pool, f"{pool.value}{i}", n // k + (i < n % k)) for i in range(k)]
    return build_topology(specs)


def test_training_ranks_first_and_interleaved_across_nodes() -> None:
    topo = build_topology([PoolNodes(Pool.ROLLOUT, "h20-a", 2), PoolNodes(Pool.TRAIN, "h800-a", 2),
                           PoolNodes(Pool.TRAIN, "h800-b", 1), PoolNodes(Pool.ROLLOUT, "h20-b", 2)])
    assert topo.train_ranks == (0, 1, 2)
    assert topo.rollout_ranks == (3, 4, 5, 6)
    assert [(r.node, r.local_index) for r in topo.ranks[:3]] == [
        ("h800-a", 0), ("h800-b", 0), ("h800-a", 1)]
    assert [r.node for r in topo.ranks[3:]] == ["h20-a", "h20-b", "h20-a", "h20-b"]
    assert topo.nodes(Pool.ROLLOUT) == ("h20-a", "h20-b")


@pytest.mark.parametrize("specs, fragment", [
    ([PoolNodes(Pool.TRAIN, "a", 1)], "'rollout'"),
    ([PoolNodes(Pool.TRAIN, "a", 0), PoolNodes(Pool.ROLLOUT, "b", 1)], "n_ranks"),
    ([PoolNodes(Pool.TRAIN, "a", 1), PoolNodes(Pool.TRAIN, "a", 1),
      PoolNodes(Pool.ROLLOUT, "b", 1)], "twice"),
])
def test_bad_allocations_are_config_errors(specs: list[PoolNodes], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_topology(specs)


@given(n_train=st.integers(1, 9), n_rollout=st.integers(1, 9), nodes=st.integers(1, 3),
       total=st.integers(1, 1 << 22))
def test_every_shard_byte_crosses_the_slow_link_exactly_once(
        n_train: int, n_rollout: int, nodes: int, total: int) -> None:
    topo = _topo(n_train, n_rollout, nodes)
    layout = ShardLayout(total, n_rollout)
    pieces = plan_streams(topo, layout)
    assert layout.shard_nbytes % ALIGN_BYTES == 0
    assert layout.padded_nbytes >= total
    assert [p.piece for p in pieces] == list(range(len(pieces)))
    for s, dst in enumerate(topo.rollout_ranks):
        mine = sorted((p for p in pieces if p.shard == s), key=lambda p: p.offset)
        assert {p.dst for p in mine} == {dst}
        assert all(p.src in topo.train_ranks for p in mine)
        assert all(p.offset % ALIGN_BYTES == 0 for p in mine)
        covered = 0
        for p in mine:
            assert p.offset == covered and p.nbytes > 0
            covered += p.nbytes
        assert covered == layout.shard_nbytes
    if n_train >= n_rollout and layout.shard_nbytes >= ALIGN_BYTES * n_train:
        assert {p.src for p in pieces} == set(topo.train_ranks)  # every uplink used


def test_shard_count_must_match_rollout_ranks() -> None:
    with pytest.raises(ConfigError, match="shard count 3"):
        plan_streams(_topo(2, 2), ShardLayout(1024, 3))


def test_a_member_topology_with_two_senders_puts_both_in_the_training_pool() -> None:
    from weave_slurm.sync.subgroup import member_topology

    topo = member_topology(["h800-0", "h800-1"], ["h20-0"])
    assert topo.train_ranks == (0, 1) and topo.rollout_ranks == (2,)
    assert topo.nodes(Pool.TRAIN) == ("h800-0", "h800-1")
    assert member_topology("h800-0", ["h20-0"]).train_ranks == (0,)   # one node, as before
