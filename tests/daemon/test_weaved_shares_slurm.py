"""Two GPU shares of one host in one group through weaved on the session's Slurm cluster
of separate hosts (issue 34; daemon/node_daemons.py, "Shares"): the scenario of
tests/runtime/test_weaved_shares.py (tests/harness/share_moves.py) with each share's
node daemon a step of its own allocation on the h20 host, reached over TCP at the port
its own step's output says, and each share's sync agent a step of that allocation on
that host (``--nodelist`` the host, the agent keyed by the share). The member moved from
the first share to the second ends with its solo run's weights; the first share is
returned."""

from __future__ import annotations

import os

import pytest

from tests.harness import weaved
from tests.harness.hosts import weaved_dirs
from tests.harness.scratch import public_dir
from tests.harness.share_moves import matches_solo, move_between_shares
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SEED = 62
ITERATIONS = 60
#: Placement pins (tests/harness/share_moves.py writes the shares' plans itself).
SITE = ("[pools.rollout]\n[pools.train]\n[limits]\nrollout = \"pinned\"\n[runtime]\n"
        "gangs = true\nplan_from_measurements = false\n")


def test_a_member_moves_between_two_shares_of_one_h20_host_and_ends_as_solo(
        slurm_cluster: SessionCluster) -> None:
    env = dict(slurm_cluster.env)
    instance, other = f"sh{os.getpid()}", f"other{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir("weaved-slurm-shares-") as public:
        site = public / "site.toml"
        site.write_text(weaved.smoke_site(SITE))
        try:
            with weaved.serving_on_slurm(weaved.rl_on_slurm(dirs, instance, env, public,
                                                            site)) as w:
                moved = move_between_shares(w, w.config.socket, SEED, ITERATIONS, other)
                matches_solo(w, moved.job, SEED, ITERATIONS)
        finally:
            weaved.release_all(SlurmCliBackend(env=env), instance=other)
