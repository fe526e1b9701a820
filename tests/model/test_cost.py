"""CostRates: the one price per node-hour per pool, for placement and accounting."""

from __future__ import annotations

import math

import pytest

from weave_slurm.config.site import default_site
from weave_slurm.errors import ConfigError
from weave_slurm.model.cost import CostRates, MoveCost
from weave_slurm.vocab import Pool

RATES = CostRates(rollout_node_hour=10.0, train_node_hour=30.0)


def test_price_per_pool_and_the_two_ways_to_price_nodes_agree() -> None:
    assert RATES.price(Pool.ROLLOUT) == 10.0 and RATES.price(Pool.TRAIN) == 30.0
    assert RATES.price("train") == 30.0  # a StrEnum: rows and JSON carry plain strings
    assert RATES.rate(3, 2) == pytest.approx(90.0)
    assert RATES.per_hour({Pool.ROLLOUT: 3, Pool.TRAIN: 2}) == RATES.rate(3, 2)
    assert RATES.per_hour({Pool.TRAIN: 1}) == 30.0
    assert RATES.per_hour({}) == 0.0


def test_from_site_prices_a_node_as_its_gpus() -> None:
    site = default_site()
    rates = CostRates.from_site(site)
    assert rates.price(Pool.ROLLOUT) == pytest.approx(
        site.rollout.price_per_gpu_hour * site.rollout.gpus_per_node)
    assert rates.price(Pool.TRAIN) == pytest.approx(site.train.price_per_node_hour)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_a_bad_price_names_the_pool_and_the_value(bad: float) -> None:
    with pytest.raises(ConfigError, match="cost rate for pool 'rollout'"):
        CostRates(rollout_node_hour=bad, train_node_hour=1.0)
    with pytest.raises(ConfigError, match="cost rate for pool 'train'"):
        CostRates(rollout_node_hour=1.0, train_node_hour=bad)


def test_an_unknown_pool_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="'h800' is unknown; valid: rollout, train"):
        RATES.price("h800")


def test_a_move_copies_each_pools_state_in_parallel_then_restarts() -> None:
    moves = MoveCost(rollout_gbps=400.0, train_gbps=200.0, restart_s=30.0,
                     repin_restart_s=2.0)
    gbit = 8 * (1 << 30) / 1e9  # Gb per GiB
    # 100 GiB of rollout state at 400 Gb/s vs 100 GiB of training state at 200 Gb/s:
    # the slower copy sets the pause.
    assert moves.copy_s(100.0, 100.0) == pytest.approx(100 * gbit / 200)
    assert moves.move_s(100.0, 10.0) == pytest.approx(100 * gbit / 400 + 30.0)
    assert moves.repin_s(100.0) == pytest.approx(100 * gbit / 400 + 2.0)
    assert MoveCost(restart_s=0.0).move_s(0.0, 0.0) == 0.0


def test_move_cost_reads_the_sites_intra_pool_links_and_rejects_bad_values() -> None:
    site = default_site()
    moves = MoveCost.from_site(site, restart_s=12.0)
    assert moves.rollout_gbps == moves.train_gbps == site.network.intra_pool_gbps
    assert moves.restart_s == 12.0
    with pytest.raises(ConfigError, match="rollout_gbps"):
        MoveCost(rollout_gbps=0.0)
    with pytest.raises(ConfigError, match="restart_s"):
        MoveCost(restart_s=math.nan)
