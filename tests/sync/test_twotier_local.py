"""Two-tier sync between real rank processes over gloo on loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from weave_slurm.sync.group_launch import check_outcomes, run_group
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import LinkSpec
from weave_slurm.sync.scenario import Method, Scenario
from weave_slurm.sync.topology import ShardLayout

pytestmark = pytest.mark.torch

VersionsFactory = Callable[[int, list[float]], tuple[str, ...]]
LOOPBACK = LinkSpec(rate_mbit=None)
MIB = 1 << 20


def _by_pool(results: list[dict], pool: str) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in results if r["pool"] == pool]


def test_delta_sync_is_bit_exact_and_refuses_stale_versions(
        make_versions: VersionsFactory) -> None:
    files = make_versions(4 * MIB + 6, [0.01, 0.3, 0.0])
    # file:     v0      v1(1%)  v2(30%) v2 again v3 (no change)  v1 again
    sc = Scenario("job-delta", n_train=2, n_rollout=3, total_nbytes=4 * MIB + 6,
                  version_files=(files[0], files[1], files[2], files[2], files[3], files[1]),
                  versions=(1, 2, 3, 3, 4, 2), mode=SyncMode.DELTA, nodes_per_pool=2)
    outcomes = run_group(sc, LOOPBACK)
    assert all(o.returncode == 0 and o.result is not None for o in outcomes), outcomes
    results = [o.result for o in outcomes if o.result is not None]
    for r in results:
        ok = [s["ok"] for s in r["steps"]]
        assert ok == [True, True, True, False, True, False], (r["rank"], r["steps"])
        for s in r["steps"]:
            if not s["ok"]:
                assert s["error"] == "VersionMismatch"
    for r in _by_pool(results, "rollout"):
        assert all(s["identical"] for s in r["steps"] if s["ok"])
    sent = [sum(r["steps"][i].get("slow_link_bytes", 0) for r in _by_pool(results, "train"))
            for i in range(5)]
    assert sent[0] >= 4 * MIB  # first version: full pieces
    assert sent[1] < 0.1 * sent[0]  # 1% changed: delta
    assert sent[1] < sent[2] < sent[0]  # 30% changed: bitmap delta, still smaller
    assert sent[4] < 0.1 * sent[0]  # after the refusal the delta base is still valid
    delta_pieces = [r["steps"][1]["delta_pieces"] for r in _by_pool(results, "train")]
    assert sum(delta_pieces) == 3


def test_more_trainers_than_rollouts_with_one_corrupt_send_each(
        make_versions: VersionsFactory) -> None:
    files = make_versions(2 * MIB, [1.0])
    sc = Scenario("job-retry", n_train=3, n_rollout=2, total_nbytes=2 * MIB,
                  version_files=files, versions=(5, 6), corrupt_attempts=1)
    results = check_outcomes(run_group(sc, LOOPBACK))
    train = _by_pool(results, "train")
    assert all(s["retries"] >= 1 for r in train for s in r["steps"][:1])
    assert {r["rank"] for r in train if r["steps"][0]["full_pieces"]} == {0, 1, 2}
    assert all(s["identical"] for r in _by_pool(results, "rollout") for s in r["steps"])


@pytest.mark.parametrize("method", [Method.NAIVE, Method.FLAT])
def test_baselines_deliver_the_same_bytes(make_versions: VersionsFactory, method: Method) -> None:
    files = make_versions(MIB, [])
    sc = Scenario("job-base", n_train=2, n_rollout=2, total_nbytes=MIB, version_files=files,
                  versions=(1,), method=method)
    results = check_outcomes(run_group(sc, LOOPBACK))
    assert all(r["steps"][0]["identical"] for r in _by_pool(results, "rollout"))


def test_small_chunks_relay_one_copy_and_survive_a_corrupt_first_send(
        make_versions: VersionsFactory) -> None:
    files = make_versions(3 * MIB, [0.05])
    sc = Scenario("job-chunks", n_train=2, n_rollout=4, total_nbytes=3 * MIB,
                  version_files=files, versions=(1, 2), mode=SyncMode.DELTA,
                  corrupt_attempts=1, chunk_nbytes=64 * 1024)
    results = check_outcomes(run_group(sc, LOOPBACK))
    rollout, train = _by_pool(results, "rollout"), _by_pool(results, "train")
    assert all(s["identical"] for r in rollout for s in r["steps"])
    shard = ShardLayout(3 * MIB, 4).shard_nbytes
    # each rollout rank took only its own shard over the slow link (first attempt and
    # the full retry); the other three shards came through the relay
    assert [r["steps"][0]["slow_link_bytes"] for r in rollout] == [2 * shard] * 4
    assert sum(r["steps"][0]["slow_link_bytes"] for r in train) == 8 * shard
    assert all(r["steps"][0]["retries"] == 2 for r in train)  # two pieces each
    assert sum(r["steps"][1]["delta_pieces"] for r in train) == 4
    assert sum(r["steps"][1]["slow_link_bytes"] for r in train) < 0.5 * 4 * shard
