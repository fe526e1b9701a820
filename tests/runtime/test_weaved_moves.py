"""A running job moved to another group by weaved's re-planning, on the LocalBackend with
real node daemons (daemon/replanning.py, daemon/handoff.py).

Groups hold at most two jobs here. ``a`` and ``c`` are placed together; ``b`` arrives
while both run and gets a group of its own. Once ``b`` has trained a few steps ``c`` is
cancelled: ``a`` is alone in its group and ``b`` in another, so consolidation puts them
in one group (one group's nodes less, the move charged). The runtime hands the moved
job off at its step boundary with its checkpoint, the other group adopts it, and the
emptied group drains. The moved job never starts over: it ends with its solo weights,
as does the other, which never stops. The last test moves a job where an arrival is
placed (the re-placement of recent arrivals) instead of after a departure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.moves import (
    checkpoint_at,
    consolidating,
    ended_as_solo,
    nodes,
    repinning,
    row,
    submit,
)
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import release_all, rl_config, serve, smoke_site, wait_states
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.states import GroupState
from weave_slurm.daemon.store import Store
from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec
from weave_slurm.slurm.cluster_config import parse_layout
from weave_slurm.slurm.local_backend import LocalBackend

pytestmark = pytest.mark.torch

LONG = 60   # iterations of a and b; c runs until it is cancelled
NEVER_STEPS = 4 * LONG   # ... where a move must wait out move_wait_s (5 s) first

SITE = """
[pools.rollout]
[pools.train]
[limits]
max_group_size = 2
[runtime]
plan_from_measurements = false
replan_interval_s = 0
recent_jobs = 0
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


def _growing_move(w: Weaved, sock: Path, seeds: tuple[int, int, int], steps: int = LONG
                  ) -> tuple[int, int, int, int, int]:
    """The scene where a and b (``steps`` each) cannot share a rollout node (100 s
    rollouts, SLO 1.5), only a training node, and c (10 s, SLO 10) shares a's: c is
    cancelled and consolidation commits a move into a group that must grow. (a, b, the
    mover, the group it leaves, the group it joins.)"""
    slow = {"rollout_s": 100.0, "slo": 1.5}
    a, b = consolidating(w, sock, seeds, steps, 3, 120, declared={
        "a": slow, "b": slow, "c": {"rollout_s": 10.0, "slo": 10.0}})
    (mover,) = wait_for(lambda: [j for j in (a, b) if row(w, j).moving_from], 120,
                        "a committed move", interval_s=0.02)
    src, gid = row(w, mover).moving_from, row(w, mover).group_id
    assert src is not None and gid is not None
    return a, b, mover, src, gid


def test_a_move_into_a_group_that_grows_waits_for_its_new_node_then_moves(
        cfg: DaemonConfig) -> None:
    """a and b cannot share a rollout node (100 s rollouts, SLO 1.5), only a training
    node; c (10 s, SLO 10) shares a's. Once c is cancelled consolidation moves a or b
    into the other's group, on a rollout node that group must first ask for (the local
    cluster has a third h20 node). The move waits for that allocation while the job runs
    on in its old group, where it keeps its place, then goes on as any other: the job is
    handed off onto the new node and still ends with its solo weights."""
    served = serve(cfg, LocalBackend(cfg.state_dir / "local", parse_layout("h20=3,h800=2")))
    try:
        w, sock = served.weaved, cfg.socket
        a, b, mover, src, gid = _growing_move(w, sock, (81, 82, 83))
        kept = w.store.group(src)   # the mover keeps its place until it has moved
        assert kept is not None and mover in kept.plan.job_ids
        settle(lambda: row(w, mover), 120, interval_s=0.1,
               until=lambda r: r.moving_from is None)
        assert row(w, mover).reason == f"moved from group {src} to group {gid} by a re-plan"
        grown = [a for a in w.store.allocs(gid, live_only=False) if a.role == "rollout"]
        assert len(grown) == 2, grown   # the node the move asked for
        ended_as_solo(w, sock, {a: 81, b: 82}, LONG, 300)
        assert set(grown[1].nodes) <= nodes(w, gid, mover)   # it ran there
        moved = w.driver.live(mover)
        assert moved is not None and moved["recoveries"] == 1, moved
        assert 3 <= checkpoint_at(moved) < LONG, moved["event"]
        emptied = settle(lambda: w.store.group(src), 60, interval_s=0.2,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
        assert not emptied.plan.members   # the place went once the job had moved in
    finally:
        served.stop()
        release_all(served.weaved.backend)


def test_a_move_whose_node_is_never_granted_is_withdrawn_and_the_job_runs_on(
        cfg: DaemonConfig) -> None:
    """As above, but another instance's allocation holds the third h20 node, so the
    node the move asks for is not granted: after ``move_wait_s`` the move is withdrawn,
    the job runs on in its old group (never handed off, never restarted) and ends with
    its solo weights; the allocation its new group asked for is given up."""
    assert cfg.site_path is not None
    cfg.site_path.write_text(smoke_site(SITE + "move_wait_s = 5\n"))
    backend = LocalBackend(cfg.state_dir / "local", parse_layout("h20=3,h800=2"))
    h20 = next(p for p in backend.layout.pools if p.partition == "h20")
    other = backend.allocate(AllocationRequest(   # a whole h20 node, not weaved's
        "1", "h20-0", (ResourceSpec("h20", 1, gpus_per_node=h20.gpus_per_node),),
        instance="someone_else"))
    served = serve(cfg, backend)
    try:
        w, sock = served.weaved, cfg.socket
        # enough steps that the mover outlives the 5 s wait (60 ended first on a fast
        # machine: the move was never withdrawn)
        a, b, mover, src, gid = _growing_move(w, sock, (91, 92, 93), NEVER_STEPS)
        back = settle(lambda: row(w, mover), 60, interval_s=0.1,
                      until=lambda r: r.moving_from is None)
        assert (back.group_id, back.moving_from) == (src, None), (
            back.reason, [(t.src, t.dst, t.reason) for t in w.store.transitions("job", mover)])
        assert back.reason == (f"its move to group {gid} was withdrawn: the nodes it needs "
                               f"there were not held within 5 s ([runtime] move_wait_s); "
                               f"it runs on in group {src}")
        assert mover not in w.store.group(gid).plan.job_ids   # type: ignore[union-attr]
        asked = settle(lambda: [x for x in w.store.allocs(gid, live_only=False)
                                if x.role == "rollout"], 30, interval_s=0.1,
                       until=lambda rows: len(rows) == 2 and rows[1].state.final)
        assert len(asked) == 2 and asked[1].state.final and not asked[1].nodes, asked
        ended_as_solo(w, sock, {a: 91, b: 92}, NEVER_STEPS, 300)
        stayed = w.driver.live(mover)
        assert stayed is not None and stayed["recoveries"] == 0, stayed
        assert not nodes(w, gid, mover)   # it never ran in the group it was to join
        assert other.alloc_id in {x.alloc_id for x in backend.list_allocations("")}
    finally:
        served.stop()
        release_all(served.weaved.backend)


def test_the_group_a_move_waits_to_leave_re_pins_its_members_once_it_is_out(
        cfg: DaemonConfig) -> None:
    """Groups of three: a (100 s rollouts, SLO 1.5) and e (10 s, SLO 10) share a rollout
    node, c (100 s, SLO 1.5) has its own. A re-plan, committed as weaved's replanner
    commits one (GroupPlan.then), moves c into a new group, whose nodes it waits for, and
    re-pins e onto c's node once c is out. Meanwhile group 1 runs its plan as it is; then
    c is handed off, group 1 takes its new plan and the runtime re-pins e at a phase
    boundary, without a restart. Once a and e end, consolidation may move c back into
    group 1, which it left: it is adopted there again. All three end with their solo
    weights."""
    assert cfg.site_path is not None
    cfg.site_path.write_text(smoke_site(SITE.replace("max_group_size = 2",
                                                     "max_group_size = 3")))
    served = serve(cfg, LocalBackend(cfg.state_dir / "local", parse_layout("h20=3,h800=2")))
    try:
        w, sock = served.weaved, cfg.socket
        done = repinning(w, sock, (71, 72, 73), (2 * LONG, 3 * LONG), str, 180)
        a, e, c = done.a, done.e, done.c
        ended_as_solo(w, sock, {a: 71, e: 72}, 2 * LONG, 300)
        ended_as_solo(w, sock, {c: 73}, 3 * LONG, 300)
        assert done.c_node in nodes(w, 1, e)   # e rolled out on c's old node once c was out
        repinned = w.driver.live(e)
        assert repinned is not None and repinned["recoveries"] == 0, repinned
    finally:
        served.stop()
        release_all(served.weaved.backend)


def test_an_arrival_re_places_two_lone_jobs_into_one_group_and_each_ends_as_solo(
        cfg: DaemonConfig) -> None:
    """Consolidation off, the scene of the growing move in groups of two leaves a alone
    in group 1 and b alone in group 2 (c cancelled); weaved restarts with groups of
    three. Then d (10 s, SLO 10) arrives: placement alone puts it beside a or b; placed
    again together (daemon/replanning.py ``with_arrivals``) the three share one group,
    one training node less: a or b moves (charged; it waits for the rollout node its new
    group asks for), written in the same transaction as d's placement into that group.
    Each ends with its solo run's weights."""
    assert cfg.site_path is not None
    arrivals = SITE.replace("recent_jobs = 0", "consolidate = false")
    cfg.site_path.write_text(smoke_site(arrivals))
    backend = LocalBackend(cfg.state_dir / "local", parse_layout("h20=3,h800=2"))
    served = serve(cfg, backend)
    try:
        w, sock = served.weaved, cfg.socket
        slow = {"rollout_s": 100.0, "slo": 1.5}   # a and b share a training node only
        a, b = consolidating(w, sock, (81, 82, 83), LONG, 3, 120, declared={
            "a": slow, "b": slow, "c": {"rollout_s": 10.0, "slo": 10.0}})
        c = next(j.job_id for j in w.store.jobs() if j.job_id not in (a, b))
        wait_states(sock, [c], {"CANCELLED"}, 60, [])
        served.stop()   # groups of three from now on: the same jobs, adopted again
        cfg.site_path.write_text(smoke_site(arrivals.replace("max_group_size = 2",
                                                             "max_group_size = 3")))
        served = serve(cfg, backend)
        w = served.weaved
        assert (row(w, a).group_id, row(w, b).group_id) == (1, 2)   # consolidation off
        assert all(row(w, j).moving_from is None for j in (a, b))
        d = submit(sock, "d", 84, LONG, rollout_s=10.0, slo=10.0)
        (mover,) = wait_for(lambda: [j for j in (a, b) if row(w, j).moving_from], 60,
                            "a committed move", interval_s=0.02)
        src, gid = row(w, mover).moving_from, row(w, mover).group_id
        assert row(w, d).group_id == gid   # placed where the re-placement put it
        reasons = [t.reason for t in w.store.transitions("job", mover)]
        assert any(r.startswith(f"moving from group {src} to group {gid}: re-placement of "
                                f"job(s) ") and f"with the arrival(s) {d} costs" in r
                   for r in reasons), reasons
        placed = [t for t in w.store.transitions("job", d) if t.dst == "PLACED"]
        assert len(placed) == 1 and placed[0].reason.endswith(
            "re-placed with recent arrivals"), placed
        settle(lambda: row(w, mover), 120, interval_s=0.1,
               until=lambda r: r.moving_from is None)
        assert row(w, mover).reason == f"moved from group {src} to group {gid} by a re-plan"
        ended_as_solo(w, sock, {a: 81, b: 82, d: 84}, LONG, 300)
        moved = w.driver.live(mover)
        assert moved is not None and moved["recoveries"] >= 1, moved   # from a checkpoint
        emptied = settle(lambda: w.store.group(src or 0), 60, interval_s=0.2,
                         until=lambda g: g is not None and g.state is GroupState.RELEASED)
        assert emptied is not None and emptied.state is GroupState.RELEASED
    finally:
        served.stop()
        release_all(served.weaved.backend)
