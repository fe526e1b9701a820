"""Two GPU shares of one host in one group, through weaved on the LocalBackend with real
node daemons (issue 34): a pooled group changes its width by asking a new allocation
beside the old one and returning the old once nothing runs on it, and on a small pool
the new share lands on a host where the group already holds one. The group's runtime
names each share's node by its node daemon's key (``<host>.<job id>``,
daemon/node_daemons.py, "Shares"), so the two shares of one host are two nodes: the
plan re-pins the member from the first share to the second, the runtime follows, the
first share is returned, and the member ends with its solo run's weights
(the scenario: tests/harness/share_moves.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.share_moves import matches_solo, move_between_shares
from tests.harness.weaved import release_all, rl_site, serve
from weave_slurm.daemon.service import DaemonConfig

pytestmark = pytest.mark.torch

SEED = 61
#: Enough iterations that the member still runs after its two moves (each waits for
#: an allocation and its node daemon to start).
ITERATIONS = 150
#: Planned with the declared profile only (a measured one fed back would re-plan the
#: group), by a placement that pins (tests/harness/share_moves.py writes the shares' plans).
SITE = ("[pools.rollout]\n[pools.train]\n[limits]\nrollout = \"pinned\"\n[runtime]\n"
        "gangs = true\nplan_from_measurements = false\n")


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with rl_site("weaved-sh-", SITE) as config:
        yield config


def test_a_member_moves_between_two_shares_of_one_host_and_ends_as_solo(
        cfg: DaemonConfig) -> None:
    served = serve(cfg)
    w = served.weaved
    try:
        moved = move_between_shares(w, cfg.socket, SEED, ITERATIONS)
        assert moved.host == "h20-1"   # the local backend's first fit: h20-0 was taken
        matches_solo(w, moved.job, SEED, ITERATIONS)
    finally:
        served.stop()
        release_all(w.backend)
