"""A running job moved to another group by weaved's re-planning, on the cluster of
separate hosts (the session's cluster: 2 h20 and 2 h800 hosts).

Groups hold at most two jobs. ``a`` and ``c`` are placed together on one h20 and one
h800 host; ``b`` arrives while both run and gets the other two hosts. Once ``b`` has
trained a few steps ``c`` is cancelled and consolidation puts ``a`` and ``b`` in one
group: the moved job is handed off at its step boundary on its old hosts, its
checkpoint is written by its old training host's node daemon to the shared checkpoint
root, and the other group's hosts adopt it from there (tests/runtime/test_weaved_moves.py
is the same on one host). Both end with their solo weights, and no host keeps a
segment of either once they are done.
"""

from __future__ import annotations

import os

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.moves import checkpoint_at, consolidating, ended_as_solo, nodes, row
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import serving
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.daemon.states import GroupState
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

LONG = 40   # iterations of b; c runs until it is cancelled
A_LONG = 4 * LONG   # a's: it outlasts the start of b's group (groups do not wait on
                    # each other: a runs ~0.2 s per step meanwhile)

SITE = """\
[site]
name = "moves-on-hosts"
[pools.rollout]
partition = "h20"
[pools.train]
partition = "h800"
[limits]
max_group_size = 2
[runtime]
gangs = false
plan_from_measurements = false
replan_interval_s = 0
recent_jobs = 0
"""


def test_a_job_moved_between_hosts_ends_with_its_solo_weights(
        slurm_cluster: SessionCluster) -> None:
    instance = f"mv{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    site = dirs.state.parent / f"{instance}-site.toml"
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text(SITE)
    cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime="rl", client_timeout_s=10.0, env=dict(slurm_cluster.env),
                       checkpoint_root=dirs.ckpt, site_path=site)
    backend = SlurmCliBackend(env=dict(slurm_cluster.env))
    with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
        sock = cfg.socket
        wait_for(sock.exists, 30, "weaved's socket", interval_s=0.1)
        a, b = consolidating(w, sock, (91, 92, 93), LONG, 1, 240, a_iterations=A_LONG)
        settle(lambda: (row(w, a), row(w, b)), 240, interval_s=0.2,
               until=lambda rows: rows[0].group_id == rows[1].group_id
               and rows[0].moving_from is None and rows[1].moving_from is None)
        gid = row(w, a).group_id
        mover, stayer = (a, b) if gid == 2 else (b, a)
        src = 3 - gid
        assert row(w, mover).reason == f"moved from group {src} to group {gid} by a re-plan"
        emptied = settle(lambda: w.store.group(src), 120, interval_s=0.3,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
        ended_as_solo(w, sock, {a: 91, b: 92}, {a: A_LONG, b: LONG}, 480)
        # the mover stepped on its old group's hosts and then on the new group's, which
        # are other hosts: its state crossed hosts only through the shared checkpoint
        old, new = nodes(w, src, mover), nodes(w, gid, mover)
        assert old and new and not old & new, (old, new)
        moved, stayed = w.driver.live(mover), w.driver.live(stayer)
        assert moved is not None and moved["recoveries"] == 1, moved
        at = checkpoint_at(moved)
        # moved mid-run, from its newest step
        assert 1 <= at < (A_LONG if mover == a else LONG), moved["event"]
        assert stayed is not None and stayed["recoveries"] == 0
    plan = slurm_cluster.cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):   # no segment of either job left on a host
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(slurm_cluster.cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; true"])
        assert out.strip() == "", f"{node}: {out}"
