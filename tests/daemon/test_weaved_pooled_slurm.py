"""A pooled group through weaved on the session's Slurm cluster of separate hosts
(issue 34's "done when"; tests/harness/pooled_run.py): three poolable jobs in one pooled
group on GPU shares of the two h20 hosts, a fourth arrives and the pool widens mid-run
(a new row of shares beside the first, on the same hosts: Slurm grows no allocation).
Each share's node daemon is a step of its own allocation on its host; every engine of a
member is a worker there. One of the fourth's engines on the new row is SIGKILLed from
its host while it rolls out: the member is recovered. Each job ends with its solo run's
weights. A pool as wide as both h20 hosts gives one back (``scontrol update``) to admit a
job that waits, whose own pool Slurm then grants there (daemon/room.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from tests.harness import weaved
from tests.harness.hosts import kill_running_worker, kill_until_recovered, weaved_dirs
from tests.harness.pooled_run import (
    SITE,
    end_admitted_as_solo,
    end_as_solo,
    end_narrowed_as_solo,
    narrow_after_a_departure,
    narrow_to_admit,
    widen_for_a_fourth,
)
from tests.harness.scratch import public_dir
from tests.harness.waits import wait_for
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@contextmanager
def pooled_weaved(slurm_cluster: SessionCluster, instance: str, text: str = SITE,
                  immediate_s: int | None = None) -> Iterator[Weaved]:
    """A weaved of the group runtime with pools on (``text``: its site) on the session's
    cluster (``immediate_s``: how long an allocation may pend before it is asked again)."""
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir(f"weaved-slurm-{instance}-") as public:
        site = public / "site.toml"
        site.write_text(weaved.smoke_site(text))
        cfg = weaved.rl_on_slurm(dirs, instance, dict(slurm_cluster.env), public, site)
        if immediate_s is not None:
            cfg = replace(cfg, immediate_s=immediate_s)
        with weaved.serving_on_slurm(cfg) as w:
            yield w


def test_a_pool_widens_on_two_h20_hosts_an_engine_is_killed_and_each_ends_as_solo(
        slurm_cluster: SessionCluster) -> None:
    instance = f"pl{os.getpid()}"
    with pooled_weaved(slurm_cluster, instance) as w:
        sock = w.config.socket
        # the fourth's phases are short: 24 steps give the kill below several tries
        run = widen_for_a_fourth(w, sock, 91, fourth_steps=24)
        hosts = {n for a in run.rows for n in a.nodes}
        assert hosts == {"h20-0", "h20-1"}, run.rows   # one pool over both hosts
        newest = max((a for a in run.rows if a.alloc_id is not None), key=lambda a: a.key)
        node = newest.nodes[-1]
        kill_until_recovered(lambda: kill_running_worker(
            slurm_cluster.cluster, node, instance, run.fourth, timeout_s=120,
            key=allocplan.node_key(newest, node, 8), engine=True),
            lambda: weaved.recoveries(sock, run.fourth))
        end_as_solo(w, sock, run, timeout_s=420)
        shown = weaved.call(sock, Op.SHOW, kind="job", id=run.fourth)
        assert "recover" in shown["reason"], shown["reason"]


def test_a_narrower_pool_gives_a_node_back_to_slurm_and_its_member_ends_as_solo(
        slurm_cluster: SessionCluster) -> None:
    """A pool striped over both h20 hosts narrows once its wide member leaves: weaved
    re-pins the other onto the node it keeps and, once no phase runs on the other,
    tells that node's daemon to end and shrinks the allocation (``scontrol update
    JobId=X NodeList=...``): Slurm lists it on one host, the node-daemon step goes on
    there, and the member ends as solo."""
    with pooled_weaved(slurm_cluster, f"pn{os.getpid()}") as w:
        run = narrow_after_a_departure(w, w.config.socket, 71)
        row = run.row
        assert len(row.nodes) == 2 and len(row.held_nodes) == 1, row
        slurm = SlurmCliBackend(env=slurm_cluster.env)
        wait_for(lambda: {a.alloc_id: a.nodes for a in slurm.list_allocations()}, 20,
                 f"Slurm to list allocation {row.alloc_id} on {row.held_nodes}",
                 interval_s=0.2, until=lambda listed: listed.get(row.alloc_id) == row.held_nodes)
        end_narrowed_as_solo(w, w.config.socket, run)


def test_a_pool_gives_a_host_back_to_admit_a_job_and_each_ends_as_solo(
        slurm_cluster: SessionCluster) -> None:
    """The first job's pool holds all 8 GPUs of both h20 hosts; the second may not join
    it (groups of one), so weaved narrows it to one host: its members re-pinned there,
    the other host given back to Slurm (``scontrol update``), on which Slurm then grants
    the second's pool (its nodes as squeue lists them). An allocation that Slurm cannot
    grant yet is cancelled after 2 s here and asked again (``immediate_s``; 10 s by
    default, which the give-back would wait for)."""
    one = SITE.replace('rollout = "pooled"', 'rollout = "pooled"\nmax_group_size = 1')
    with pooled_weaved(slurm_cluster, f"pa{os.getpid()}", one, immediate_s=2) as w:
        run = narrow_to_admit(w, w.config.socket, 41)
        end_admitted_as_solo(w, w.config.socket, run, timeout_s=420)
