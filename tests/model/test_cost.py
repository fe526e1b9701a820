"""CostRates: the one price per node-hour per pool, for placement and accounting."""

from __future__ import annotations

import math

import pytest

from weave_slurm.config.site import default_site
from weave_slurm.errors import ConfigError
from weave_slurm.model.cost import CostRates
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
