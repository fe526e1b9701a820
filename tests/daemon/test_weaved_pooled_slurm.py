"""A pooled group through weaved on the session's Slurm cluster of separate hosts
(issue 34's "done when"; tests/harness/pooled_run.py): three poolable jobs in one pooled
group on GPU shares of the two h20 hosts, a fourth arrives and the pool widens mid-run
(a new row of shares beside the first, on the same hosts: Slurm grows no allocation).
Each share's node daemon is a step of its own allocation on its host; every engine of a
member is a worker there. One of the fourth's engines on the new row is SIGKILLed from
its host while it rolls out: the member is recovered. Each job ends with its solo run's
weights."""

from __future__ import annotations

import os

import pytest

from tests.harness import weaved
from tests.harness.hosts import kill_running_worker, kill_until_recovered, weaved_dirs
from tests.harness.pooled_run import SITE, end_as_solo, widen_for_a_fourth
from tests.harness.scratch import public_dir
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.protocol import Op

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_a_pool_widens_on_two_h20_hosts_an_engine_is_killed_and_each_ends_as_solo(
        slurm_cluster: SessionCluster) -> None:
    env = dict(slurm_cluster.env)
    instance = f"pl{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir("weaved-slurm-pooled-") as public:
        site = public / "site.toml"
        site.write_text(weaved.smoke_site(SITE))
        with weaved.serving_on_slurm(weaved.rl_on_slurm(dirs, instance, env, public,
                                                        site)) as w:
            sock = w.config.socket
            run = widen_for_a_fourth(w, sock, 91)
            hosts = {n for a in run.rows for n in a.nodes}
            assert hosts == {"h20-0", "h20-1"}, run.rows   # one pool over both hosts
            newest = max((a for a in run.rows if a.alloc_id is not None),
                         key=lambda a: a.key)
            node = newest.nodes[-1]
            kill_until_recovered(lambda: kill_running_worker(
                slurm_cluster.cluster, node, instance, run.fourth, timeout_s=120,
                key=allocplan.node_key(newest, node, 8), engine=True),
                lambda: weaved.recoveries(sock, run.fourth))
            end_as_solo(w, sock, run, timeout_s=420)
            shown = weaved.call(sock, Op.SHOW, kind="job", id=run.fourth)
            assert "recover" in shown["reason"], shown["reason"]
