"""Chaos in CI (issue 33, item 3): weaved SIGKILLed again and again, a node set DOWN,
a stopped slurmd and a second user flooding weaved, all at once, on the session's
cluster of separate hosts (the scenario: tests/reliability/chaos.py; its figures:
bench/chaos.py).

Asserted: no accepted job lost and none listed twice (checked at every poll); every
job COMPLETED with the weights of its solo run; the flood bounded by the site's
``[limits.user]`` (refusals in one line naming the limit); the quiet user's job placed
in its fair-share turn, before a flood job that was already pending when it came; no
zombie child of weaved, no node daemon or worker and no segment or other file of a
job (its ``.lock``) left in any host's /dev/shm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.reliability.chaos import ChaosPlan, chaos_place, run_chaos
from tests.reliability.conftest import TestUser
from tests.reliability.test_slurm_faults import Place
from tests.slurm.session_cluster import SessionCluster

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.fixture
def place(slurm_cluster: SessionCluster) -> Iterator[Place]:
    with chaos_place(slurm_cluster.cluster, slurm_cluster.env) as p:
        yield p


def test_chaos_kills_down_node_stopped_slurmd_and_a_flooding_user(
        place: Place, test_users: tuple[TestUser, TestUser],
        python_for_users: list[str]) -> None:
    flooder, quiet = test_users
    plan = ChaosPlan()
    rep = run_chaos(place, flooder, quiet, plan)
    print(f"chaos: flood errors {rep.flood_errors}, refused {rep.refused}, "
          f"{rep.conn_refused}")
    print(f"chaos: {len(rep.jobs)} jobs, {len(rep.kills)} kills, {rep.wall_s:.0f} s; "
          f"kills: {rep.kills}; placed after: {rep.placed_s}; down {rep.down_node}, "
          f"slurmd stopped {rep.stopped_slurmd}")
    assert len(rep.kills) == plan.kills
    assert rep.lost == [] and rep.duplicated == [], (rep.lost, rep.duplicated)
    owners = sorted(rep.owners.values())
    assert owners.count("root") == plan.root_jobs and owners.count("quiet") == 1, owners
    assert owners.count("flood") >= 1, owners
    states = {j: r["state"] for j, r in rep.jobs.items()}
    assert set(states.values()) == {"COMPLETED"}, rep.jobs
    assert rep.digests_equal and all(rep.digests_equal.values()), rep.digests_equal
    assert set(rep.digests_equal) == set(rep.jobs)
    assert rep.flood_errors == [], rep.flood_errors
    # the flood: bounded; its connections past 16 and its submissions past the limit
    # refused, each in one line naming the limit
    assert len(rep.conn_refused) == 1 and "per user" in rep.conn_refused[0], rep.conn_refused
    assert "\n" not in rep.conn_refused[0].strip()
    assert rep.refused, "no flood submission was refused"
    for msg in rep.refused:
        assert "\n" not in msg.strip() and "limits.user.max_pending" in msg, msg
    assert owners.count("flood") <= plan.flood_jobs - len(rep.refused)
    # the quiet user's turn: its job (no usage) goes before the flooding user's job
    # queued when it came (held by limits.user.max_running, and later in fair share)
    quiet_job = next(j for j, o in rep.owners.items() if o == "quiet")
    assert rep.pending_at_quiet, "no flood job was pending when the quiet job came"
    assert all(rep.placed_ts[f] >= rep.placed_ts[quiet_job] for f in rep.pending_at_quiet), \
        (rep.placed_ts, rep.pending_at_quiet, quiet_job)
    # nothing left
    assert rep.zombies == [], rep.zombies
    assert not rep.processes_left
    assert rep.segments_left == {}, rep.segments_left
    # nor any other file of the jobs (a job directory's .lock: issue 33, C4)
    assert rep.shm_left == {}, rep.shm_left
