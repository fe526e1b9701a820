"""An arrival re-places the running jobs placed last, through a running weaved on the
LocalBackend with real node daemons (daemon/replanning.py ``with_arrivals``,
daemon/placing.py; the decisions alone: tests/daemon/test_replanning.py).

Consolidation is off. The scene of the growing move (tests/runtime/test_weaved_moves.py)
in groups of at most two leaves ``a`` alone in group 1 and ``b`` alone in group 2 (100 s
rollouts, SLO 1.5: they may share a training node, not a rollout node; ``c``, which
shared ``a``'s, cancelled). weaved restarts with groups of three. Then ``d`` (10 s, SLO
10) arrives: placement alone puts it beside ``a`` or ``b``; placed again together, the
three share one group (one training node less): ``a`` or ``b`` moves (charged; it waits
for the rollout node its new group asks for), written in the same transaction as
``d``'s placement into that group. Each ends with its solo run's weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.moves import consolidating, ended_as_solo, row, submit
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import release_all, rl_config, serve, smoke_site, wait_states
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.daemon.states import GroupState
from weave_slurm.slurm.cluster_config import parse_layout
from weave_slurm.slurm.local_backend import LocalBackend

pytestmark = pytest.mark.torch

LONG = 60
SITE = """
[pools.rollout]
[pools.train]
[limits]
max_group_size = 2
[runtime]
plan_from_measurements = false
replan_interval_s = 0
consolidate = false
"""


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with public_dir("weaved-arr-") as public, shm_dir("weaved-arr-") as shm:
        (public / "site.toml").write_text(smoke_site(SITE))
        yield rl_config(public, shm, site_path=public / "site.toml")


def test_an_arrival_re_places_two_lone_jobs_into_one_group_and_each_ends_as_solo(
        cfg: DaemonConfig) -> None:
    assert cfg.site_path is not None
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
        cfg.site_path.write_text(smoke_site(SITE.replace("max_group_size = 2",
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
