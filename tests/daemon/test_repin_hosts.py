"""A waiting move whose old group re-pins its other members once the job is out, on a
Slurm cluster of separate hosts (3 h20 and 2 h800 hosts of its own, brought up for this
test: the session's 2 + 2 leave no node for the new group).

tests/runtime/test_weaved_moves.py runs the same scene on one host. Groups of three:
``a`` (100 s rollouts, SLO 1.5) and ``e`` (10 s, SLO 10) share an h20 host, ``c`` (100
s, SLO 1.5) has another. A re-plan, committed into weaved's store as the replanner
commits one (``GroupPlan.then``), moves ``c`` into a new group, which asks Slurm for an
h20 and an h800 host, and re-pins ``e`` onto ``c``'s host once ``c`` is out. Meanwhile
group 1 runs its plan as it is; then ``c`` is handed off through the shared checkpoint
root, group 1 takes its new plan, and the runtime moves ``e``'s rollout to the other
host at a phase boundary, without a restart. All three end with their solo weights,
and no host keeps a segment of any of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.hosts import hosts_cluster, on_host, weaved_dirs
from tests.harness.moves import ended_as_solo, nodes, repinning
from tests.harness.waits import wait_for
from tests.harness.weaved import serving
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.membership import group_label
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.cluster_config import ClusterLayout, PoolShape
from weave_slurm.slurm.local_cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

LONG = 40   # iterations of a and e
C_LONG = 100   # of c: its move (a new group asks Slurm for hosts) comes well before its end

LAYOUT = ClusterLayout((PoolShape("h20", "h20", 3, gpus_per_node=8, cpus_per_node=8),
                        PoolShape("h800", "h800", 2, gpus_per_node=8, cpus_per_node=8)))

SITE = """\
[site]
name = "repin-on-hosts"
[pools.rollout]
partition = "h20"
[pools.train]
partition = "h800"
[limits]
max_group_size = 3
[runtime]
gangs = false
plan_from_measurements = false
replan_interval_s = 0
recent_jobs = 0
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with hosts_cluster(tmp_path / "cluster", LAYOUT) as up:
        yield up


def test_the_group_a_move_waits_to_leave_re_pins_a_member_onto_another_host(
        cluster: LocalCluster) -> None:
    instance = f"rp{os.getpid()}"
    dirs = weaved_dirs(cluster, instance)
    site = dirs.state.parent / f"{instance}-site.toml"
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text(SITE)
    env = dict(cluster.env)
    cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime=DriverKind.RL, client_timeout_s=10.0, env=env,
                       checkpoint_root=dirs.ckpt, site_path=site)
    with serving(cfg, SlurmCliBackend(env=env), prefix=f"weave-g{instance}.") as w:
        sock = cfg.socket
        wait_for(sock.exists, 30, "weaved's socket", interval_s=0.1)
        done = repinning(w, sock, (81, 82, 83), (LONG, C_LONG),
                         lambda gid: group_label(instance, gid), 300)
        a, e, c, new = done.a, done.e, done.c, done.new
        assert done.e_node != done.c_node
        assert {done.e_node, done.c_node} <= {"h20-0", "h20-1", "h20-2"}
        ended_as_solo(w, sock, {a: 81, e: 82}, LONG, 480)
        ended_as_solo(w, sock, {c: 83}, C_LONG, 480)
        # e rolled out on its first host, then on c's: another host, reached through
        # its node daemon there; c trained on group 1's h800 host, then on its own
        assert {done.e_node, done.c_node} <= nodes(w, 1, e), nodes(w, 1, e)
        assert not nodes(w, 1, c) & nodes(w, new, c), (nodes(w, 1, c), nodes(w, new, c))
        repinned, moved = w.driver.live(e), w.driver.live(c)
        assert repinned is not None and repinned["recoveries"] == 0, repinned
        assert moved is not None and moved["recoveries"] == 1, moved
    plan = cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):   # no segment of any job left on a host
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; true"])
        assert out.strip() == "", f"{node}: {out}"
