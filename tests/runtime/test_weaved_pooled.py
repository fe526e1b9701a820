"""Pooled groups through weaved, on the LocalBackend with real node daemons
(tests/harness/pooled_run.py): three poolable jobs in one pooled group of GPU shares, a
fourth widens it mid-run, each ends with its solo run's weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import weaved
from tests.harness.pooled_run import SITE, end_as_solo, widen_for_a_fourth
from weave_slurm.daemon.service import DaemonConfig

pytestmark = [pytest.mark.torch]


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with weaved.rl_site("weaved-pool-", SITE) as config:
        yield config


def test_a_pool_of_three_widens_for_a_fourth_and_each_ends_as_solo(cfg: DaemonConfig) -> None:
    served = weaved.serve(cfg)
    try:
        run = widen_for_a_fourth(served.weaved, cfg.socket, 81)
        end_as_solo(served.weaved, cfg.socket, run)
    finally:
        weaved.stop_released(served)
