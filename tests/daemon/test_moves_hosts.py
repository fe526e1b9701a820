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
from pathlib import Path

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.states import GroupState
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.vocab import Phase

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

LONG = 40   # iterations of a and b; c runs until it is cancelled

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
"""


def _submit(sock: Path, name: str, seed: int, iterations: int) -> int:
    spec = job_spec_toml(name, iterations=iterations, seed=seed, options=OPTIONS)
    return int(call(sock, Op.SUBMIT, spec=spec, source=f"{name}.toml")["job"])


def _row(w: Weaved, job: int) -> JobRow:
    row = w.store.job(job)
    assert row is not None
    return row


def _hosts(w: Weaved, gid: int, job: int) -> set[str]:
    """The nodes (hosts) ``job`` rolled out or trained on in group ``gid``."""
    spans = getattr(w.driver, "spans", {}).get(gid, [])
    return {s.node for s in spans if s.job_id == str(job) and s.ok
            and s.kind in (Phase.ROLLOUT, Phase.TRAIN)}


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
        a, c = _submit(sock, "a", 91, LONG), _submit(sock, "c", 93, 10 * LONG)
        wait_for(lambda: w.driver.live(a), 240, "a at version 1", interval_s=0.2,
                 until=lambda live: live is not None and (live["version"] or 0) >= 1)
        b = _submit(sock, "b", 92, LONG)
        wait_states(sock, [b], {"RUNNING"}, 240, [])
        assert [_row(w, j).group_id for j in (a, c, b)] == [1, 1, 2]
        wait_for(lambda: w.driver.live(b), 240, "b at version 1", interval_s=0.2,
                 until=lambda live: live is not None and (live["version"] or 0) >= 1)
        assert [_row(w, j).state.value for j in (a, b, c)] == ["RUNNING"] * 3
        assert call(sock, Op.CANCEL, jobs=[c])["results"][0]["ok"]
        settle(lambda: (_row(w, a), _row(w, b)), 240, interval_s=0.2,
               until=lambda rows: rows[0].group_id == rows[1].group_id
               and rows[0].moving_from is None and rows[1].moving_from is None)
        gid = _row(w, a).group_id
        mover, stayer = (a, b) if gid == 2 else (b, a)
        src = 3 - gid
        assert _row(w, mover).reason == f"moved from group {src} to group {gid} by a re-plan"
        emptied = settle(lambda: w.store.group(src), 120, interval_s=0.3,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
        rows = wait_states(sock, [a, b], {"COMPLETED", "FAILED"}, 480, [])
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        for job, seed in ((a, 91), (b, 92)):
            done = w.driver.live(job)
            assert done is not None and done["version"] == LONG
            solo = run_solo(MemberSpec(str(job), seed=seed, steps=LONG, options=OPTIONS))
            assert done["weights_sha256"] == weights_digest(solo.weights), f"job {job}"
        # the mover stepped on its old group's hosts and then on the new group's, which
        # are other hosts: its state crossed hosts only through the shared checkpoint
        old, new = _hosts(w, src, mover), _hosts(w, gid, mover)
        assert old and new and not old & new, (old, new)
        moved, stayed = w.driver.live(mover), w.driver.live(stayer)
        assert moved is not None and moved["recoveries"] == 1, moved
        at = int(moved["event"].rsplit("checkpoint v", 1)[1].split()[0])
        assert 1 <= at < LONG, moved["event"]   # moved mid-run, from its newest step
        assert stayed is not None and stayed["recoveries"] == 0
    plan = slurm_cluster.cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):   # no segment of either job left on a host
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(slurm_cluster.cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; true"])
        assert out.strip() == "", f"{node}: {out}"
