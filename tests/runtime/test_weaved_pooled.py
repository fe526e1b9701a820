"""Pooled groups through weaved, on the LocalBackend with real node daemons
(tests/harness/pooled_run.py): three poolable jobs in one pooled group of GPU shares, a
fourth widens it mid-run, each ends with its solo run's weights; a pool as wide as the
rollout partition is narrowed to admit a job that waits (daemon/room.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import weaved
from tests.harness.pooled_run import (
    SITE,
    end_admitted_as_solo,
    end_as_solo,
    narrow_to_admit,
    widen_for_a_fourth,
)
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


def test_a_wide_pool_is_narrowed_to_admit_a_job_and_each_ends_as_solo() -> None:
    """The first job's pool takes both rollout nodes (16 GPUs); the second, which may not
    join it, is placed once weaved narrows that pool to one node: the first's members
    are re-pinned onto it, the other node is given back, and the second's pool of 8
    GPUs is granted there. Both end with their solo weights."""
    site = SITE.replace('rollout = "pooled"', 'rollout = "pooled"\nmax_group_size = 1')
    with weaved.rl_site("weaved-room-", site) as cfg:
        served = weaved.serve(cfg)
        try:
            run = narrow_to_admit(served.weaved, cfg.socket, 61)
            end_admitted_as_solo(served.weaved, cfg.socket, run)
        finally:
            weaved.stop_released(served)
