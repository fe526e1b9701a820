"""A running job moved to another group by weaved's re-planning, on the LocalBackend with
real node daemons (daemon/replanning.py, daemon/handoff.py).

Groups hold at most two jobs here. ``a`` and ``c`` are placed together; ``b`` arrives
while both run and gets a group of its own. Once ``b`` has trained a few steps ``c`` is
cancelled: ``a`` is alone in its group and ``b`` in another, so consolidation puts them
in one group (one group's nodes less, the move charged). The runtime hands the moved
job off at its step boundary with its checkpoint, the other group adopts it, and the
emptied group drains. The moved job never starts over: it ends with its solo weights,
as does the other, which never stops.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.moves import checkpoint_at, consolidating, ended_as_solo, nodes, row
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import release_all, rl_config, serve, smoke_site
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.daemon.states import GroupState
from weave_slurm.daemon.store import Store

pytestmark = pytest.mark.torch

LONG = 60   # iterations of a and b; c runs until it is cancelled

SITE = """
[pools.rollout]
[pools.train]
[limits]
max_group_size = 2
[runtime]
plan_from_measurements = false
replan_interval_s = 0
"""


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with public_dir("weaved-mv-") as public, shm_dir("weaved-mv-") as shm:
        (public / "site.toml").write_text(smoke_site(SITE))
        yield rl_config(public, shm, site_path=public / "site.toml")


def test_consolidation_moves_a_running_job_which_ends_as_if_alone(cfg: DaemonConfig) -> None:
    served = serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        a, b = consolidating(w, sock, (61, 62, 63), LONG, 3, 120)
        # consolidation puts a and b in one group: whichever keeps its group's id
        # (placement's relabelling) stays, the other moves
        settle(lambda: (row(w, a), row(w, b)), 120, interval_s=0.1,
               until=lambda rows: rows[0].group_id == rows[1].group_id
               and rows[0].moving_from is None and rows[1].moving_from is None)
        gid = row(w, a).group_id
        assert gid == row(w, b).group_id
        mover, stayer = (a, b) if gid == 2 else (b, a)
        src = 3 - gid
        reasons = [t.reason for t in w.store.transitions("job", mover)]
        assert any(r.startswith(f"moving from group {src} to group {gid}: consolidation "
                                "after a departure costs") for r in reasons), reasons
        assert row(w, mover).reason == f"moved from group {src} to group {gid} by a re-plan"
        emptied = settle(lambda: w.store.group(src), 60, interval_s=0.2,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
        assert "a re-plan moved its members to other groups" in \
            [t.reason for t in w.store.transitions("group", src)]
        ended_as_solo(w, sock, {a: 61, b: 62}, LONG, 300)
        # the mover ran on both groups' nodes, re-admitted once from its checkpoint
        # (never from scratch); the other stayed on its own and never stopped
        assert nodes(w, src, mover) and nodes(w, gid, mover)
        moved, stayed = w.driver.live(mover), w.driver.live(stayer)
        assert moved is not None and moved["recoveries"] == 1, moved
        at = checkpoint_at(moved)
        assert 3 <= at < LONG, moved["event"]   # moved mid-run, from its newest step
        assert stayed is not None and stayed["recoveries"] == 0 and not nodes(w, src, stayer)
    finally:
        served.stop()
        release_all(served.weaved.backend)


def test_a_weaved_restart_mid_move_adopts_the_job_from_its_newest_checkpoint(
        cfg: DaemonConfig) -> None:
    """weaved stops once a move is committed and before the new group has adopted the
    job: the restarted weaved finds no runner holding it, so the new group adopts it from
    the newest checkpoint under its old group's training node, and it still ends with
    its solo weights."""
    served = serve(cfg)
    try:
        w, sock = served.weaved, cfg.socket
        a, b = consolidating(w, sock, (71, 72, 73), LONG, 3, 120)
        moving = wait_for(lambda: [j for j in (a, b) if row(w, j).moving_from], 120,
                          "a committed move", interval_s=0.02)
        served.stop()
        assert not served.thread.is_alive()
        (mover,) = moving
        store = Store(cfg.state_dir / "weaved.db")   # as the stopped weaved left it
        kept = store.job(mover)
        store.close()
        assert kept is not None and kept.moving_from is not None, "the move ended first"
        src, gid = kept.moving_from, kept.group_id
        served = serve(cfg)   # a fresh weaved on the same state dir
        w = served.weaved
        ended_as_solo(w, sock, {a: 71, b: 72}, LONG, 300)
        moved = w.driver.live(mover)   # adopted from its old training node's checkpoint
        assert moved is not None and moved["recoveries"] == 1, moved
        assert f"moved from group {src} by a re-plan; re-admitted from checkpoint v" in \
            str(moved["event"]), moved
        at = checkpoint_at(moved)
        assert 3 <= at < LONG, moved["event"]
        assert nodes(w, gid, mover)   # it ran on in its new group, after the restart
        emptied = settle(lambda: w.store.group(src), 60, interval_s=0.2,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
    finally:
        served.stop()
        release_all(served.weaved.backend)
