"""Pooled groups through weaved, on the LocalBackend with real node daemons
(tests/harness/pooled_run.py): three poolable jobs in one pooled group of GPU shares, a
fourth widens it mid-run, each ends with its solo run's weights; a pool as wide as the
rollout partition is narrowed to admit a job that waits (daemon/room.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.harness import weaved
from tests.harness.pooled_run import (
    SITE,
    end_admitted_as_solo,
    end_as_solo,
    narrow_to_admit,
    widen_for_a_fourth,
)
from weave_slurm.daemon.service import Weaved

pytestmark = [pytest.mark.torch]


@contextmanager
def serving(prefix: str, site: str) -> Iterator[Weaved]:
    """A weaved of the group runtime on the site ``site``, stopped with its allocations
    released."""
    with weaved.rl_site(prefix, site) as cfg:
        served = weaved.serve(cfg)
        try:
            yield served.weaved
        finally:
            weaved.stop_released(served)


def test_a_pool_of_three_widens_for_a_fourth_and_each_ends_as_solo() -> None:
    with serving("weaved-pool-", SITE) as w:
        run = widen_for_a_fourth(w, w.config.socket, 81)
        end_as_solo(w, w.config.socket, run)


def test_a_wide_pool_is_narrowed_to_admit_a_job_and_each_ends_as_solo() -> None:
    """The first job's pool takes both rollout nodes (16 GPUs); the second, which may not
    join it, is placed once weaved narrows that pool to one node: the first's members
    are re-pinned onto it, the other node is given back, and the second's pool of 8
    GPUs is granted there. Both end with their solo weights."""
    site = SITE.replace('rollout = "pooled"', 'rollout = "pooled"\nmax_group_size = 1')
    with serving("weaved-room-", site) as w:
        run = narrow_to_admit(w, w.config.socket, 61)
        end_admitted_as_solo(w, w.config.socket, run)
