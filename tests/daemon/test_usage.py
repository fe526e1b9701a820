"""Usage records booked by the reconcile loop's meter, on a store driven with a fake clock:
each member's share of its group's allocations, its phase times, written tick by tick and
carried on by a new meter on the same file (a weaved restart)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.harness.old_store import make_old
from tests.harness.specs import stored
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.schema import SCHEMA_VERSION
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.usage_meter import UsageMeter
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase, Pool

RATES = CostRates(rollout_node_hour=10.0, train_node_hour=30.0)
H = 3600.0


class FakeRuntime:
    """A driver with a timeline (what GroupRuntime keeps as ``spans``)."""

    def __init__(self) -> None:
        self.spans: dict[int, list[Span]] = {}


def _job(store: Store, name: str, now: float) -> int:
    return store.add_job(uid=1000, user="alice", name=name, **stored(name),
                         source=f"{name}.toml", profile=simple_profile(name, 10, 10, 1.5),
                         now=now)


def _alloc(store: Store, role: str, alloc_id: str, held_s: float) -> int:
    key = store.add_alloc(group_id=1, role=role, pool=f"{role}-0", partition=role,
                          node_count=1, gpus_per_node=8, gpu_type=None, cpus_per_node=2,
                          now=held_s, reason="initial")
    store.transition("alloc", key, AllocState.ALLOCATING, "asking", held_s)
    store.transition("alloc", key, AllocState.HELD, "granted", held_s, alloc_id=alloc_id)
    return key


def _release(store: Store, key: int, at: float) -> None:
    store.transition("alloc", key, AllocState.RELEASING, "releasing", at)
    store.transition("alloc", key, AllocState.RELEASED, "released", at)


def _end(store: Store, job: int, at: float) -> None:
    store.transition("job", job, JobState.COMPLETED, "done", at, ended_s=at)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Group 1: jobs 1 and 2 placed at t=0, rollout alloc 101 and train alloc 102 held
    from t=0 (both jobs running)."""
    s = Store(tmp_path / "w.db")
    a, b = _job(s, "a", 0.0), _job(s, "b", 0.0)
    plan = GroupPlan(1, 1, (MemberPlan(a, (0,)), MemberPlan(b, (0,))))
    s.commit_placement([(1, "1", plan, True)], [(a, 1, "new"), (b, 1, "direct")], 0.0)
    _alloc(s, "rollout", "101", 0.0)
    _alloc(s, "train", "102", 0.0)
    for job in (a, b):
        s.transition("job", job, JobState.RUNNING, "launched", 0.0, started_s=0.0)
    return s


def test_each_tick_books_the_window_equally(store: Store) -> None:
    meter = UsageMeter(store, RATES)
    meter.advance(0.5 * H)
    first = store.usage()
    assert first[1].gpu_s == pytest.approx({"rollout": 2 * H, "train": 2 * H})  # 8 x 0.5h / 2
    meter.advance(1 * H)
    rows = store.usage()
    for job in (1, 2):
        assert rows[job].gpu_s == pytest.approx({"rollout": 4 * H, "train": 4 * H})
        assert rows[job].node_s == pytest.approx({"rollout": 0.5 * H, "train": 0.5 * H})
        assert rows[job].cost == pytest.approx(0.5 * 10.0 + 0.5 * 30.0)
        assert rows[job].alloc_ids == ("101", "102")
        assert rows[job].updated_s == 1 * H
    assert store.usage_marks()[1].until_s == 1 * H


def test_a_member_that_ended_stops_paying_and_the_rest_pay_all(store: Store) -> None:
    meter = UsageMeter(store, RATES)
    _end(store, 1, 1 * H)
    meter.advance(3 * H)
    rows = store.usage()
    assert rows[1].gpu_s["train"] == pytest.approx(4 * H)          # 1 h halved
    assert rows[2].gpu_s["train"] == pytest.approx(4 * H + 16 * H)  # then 2 h alone
    assert rows[1].cost + rows[2].cost == pytest.approx(3 * (10.0 + 30.0))


def test_a_node_given_back_is_charged_until_it_was_given_back(tmp_path: Path) -> None:
    """A pooled group's row of two nodes gives one back to Slurm at 1 h (a shrink,
    daemon/allocplan.py "Spare nodes"): two nodes charged for 1 h, one after; the
    metrics' held nodes count only the one."""
    s = Store(tmp_path / "w.db")
    a = _job(s, "a", 0.0)
    plan = GroupPlan(1, 1, (MemberPlan(a, (0,)),), rollout_gpus=4)
    s.commit_placement([(1, "1", plan, True)], [(a, 1, "new")], 0.0)
    key = s.add_alloc(group_id=1, role="rollout", pool="h20-0", partition="h20",
                      node_count=2, gpus_per_node=4, gpu_type=None, cpus_per_node=1,
                      now=0.0, reason="initial")
    s.transition("alloc", key, AllocState.ALLOCATING, "asking", 0.0)
    s.transition("alloc", key, AllocState.HELD, "granted", 0.0, alloc_id="101",
                 nodes='["h20-0", "h20-1"]')
    _alloc(s, "train", "102", 0.0)
    s.transition("job", a, JobState.RUNNING, "launched", 0.0, started_s=0.0)
    s.update("alloc", key, gone='[["h20-1", 3600.0]]')
    (row,) = [x for x in s.allocs(1) if x.role == "rollout"]
    assert (row.gone, row.gone_s, row.held_nodes) == (("h20-1",), (H,), ("h20-0",))
    UsageMeter(s, RATES).advance(3 * H)
    assert s.usage()[a].gpu_s["rollout"] == pytest.approx(4 * 2 * H + 4 * 2 * H)
    assert s.usage()[a].node_s["rollout"] == pytest.approx(2 * H + 2 * H)   # nodes x time
    held = {(r[0], r[2]): r[4] for r in s.counts()["allocations"]}
    assert held[("rollout", "HELD")] == 1


def test_a_released_group_is_closed_and_idle_time_kept_apart(store: Store) -> None:
    meter = UsageMeter(store, RATES)
    _end(store, 1, 1 * H)
    _end(store, 2, 1 * H)
    for key in (1, 2):
        _release(store, key, 1.5 * H)   # held half an hour with nobody in the group
    store.transition("group", 1, GroupState.DRAINING, "empty", 1 * H)
    store.transition("group", 1, GroupState.RELEASED, "released", 1.5 * H)
    meter.advance(2 * H)
    mark = store.usage_marks()[1]
    assert mark.closed and mark.idle_gpu_s == pytest.approx({"rollout": 4 * H, "train": 4 * H})
    assert mark.idle_cost == pytest.approx(0.5 * 40.0)
    before = store.usage()
    meter.advance(10 * H)   # closed: nothing more is booked
    assert store.usage() == before
    paid = 1.5 * (10.0 + 30.0)
    assert sum(r.cost for r in before.values()) + mark.idle_cost == pytest.approx(paid)


def test_a_restarted_meter_books_the_downtime_once(store: Store, tmp_path: Path) -> None:
    UsageMeter(store, RATES).advance(1 * H)
    store.close()
    again = Store(tmp_path / "w.db")   # weaved restarted; its allocations were kept
    meter = UsageMeter(again, RATES)
    meter.advance(3 * H)
    meter.advance(3 * H)               # the same instant again adds nothing
    rows = again.usage()
    assert rows[1].gpu_s["rollout"] == pytest.approx(8 * 3 * H / 2)
    assert rows[2].cost == pytest.approx(3 * 40.0 / 2)


def test_phase_times_are_the_union_of_spans_as_they_end(store: Store) -> None:
    runtime = FakeRuntime()
    meter = UsageMeter(store, RATES, runtime)
    spans = runtime.spans.setdefault(1, [])
    # a rollout of job 1 on two nodes at once counts once: 10 s, not 18
    spans += [Span("1", Phase.ROLLOUT, "h20-0", Pool.ROLLOUT, 100.0, 110.0),
              Span("1", Phase.ROLLOUT, "h20-1", Pool.ROLLOUT, 102.0, 108.0)]
    meter.advance(60.0)
    spans += [Span("1", Phase.ROLLOUT, "h20-1", Pool.ROLLOUT, 104.0, 112.0),   # 2 s more
              Span("1", Phase.SYNC, "h800-0", Pool.TRAIN, 112.0, 113.5),
              Span("2", Phase.TRAIN, "h800-0", Pool.TRAIN, 113.5, 120.0)]
    meter.advance(120.0)
    rows = store.usage()
    assert rows[1].phase_s == pytest.approx({"rollout": 12.0, "sync": 1.5, "train": 0.0})
    assert rows[2].phase_s == pytest.approx({"rollout": 0.0, "sync": 0.0, "train": 6.5})
    # a rebuilt runner starts a new list; the old one is read to its end first
    old = runtime.spans[1]
    runtime.spans[1] = [Span("2", Phase.TRAIN, "h800-0", Pool.TRAIN, 200.0, 201.0)]
    old.append(Span("2", Phase.TRAIN, "h800-0", Pool.TRAIN, 130.0, 134.0))
    meter.advance(180.0)
    assert store.usage()[2].phase_s["train"] == pytest.approx(6.5 + 4.0 + 1.0)


def test_no_member_placed_yet_books_nothing_for_jobs(tmp_path: Path) -> None:
    s = Store(tmp_path / "w.db")
    _job(s, "a", 0.0)
    UsageMeter(s, RATES).advance(100.0)
    assert s.usage() == {} and s.usage_marks() == {}


def test_a_version_2_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    Store(path).close()
    make_old(path, 2)   # what a weaved before accounting wrote
    store = Store(path)
    assert store.usage() == {} and store.usage_marks() == {}
    key = store.add_alloc(group_id=1, role="train", pool="h800-0", partition="h800",
                          node_count=1, gpus_per_node=8, gpu_type=None, cpus_per_node=2,
                          now=0.0, reason="initial", account="rl", qos="high",
                          time_limit_min=30)
    (row,) = [a for a in store.allocs(1) if a.key == key]
    assert (row.account, row.qos, row.time_limit_min) == ("rl", "high", 30)
    version = sqlite3.connect(path).execute(
        "SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION)


def test_sacct_shows_a_user_only_their_own_jobs(store: Store) -> None:
    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.protocol import PermissionDenied
    from weave_slurm.daemon.usage_view import sacct

    bob = store.add_job(uid=1001, user="bob", name="b", **stored("b"), source="b.toml",
                        profile=simple_profile("b", 10, 10, 1.5), now=5 * H)
    UsageMeter(store, RATES).advance(1 * H)
    site = default_site()

    def ids(uid: int, name: str, **args: object) -> list[int]:
        return [r["job"] for r in sacct(store, site, uid, name, {0}, dict(args), 6 * H)["jobs"]]

    assert ids(1000, "alice") == [1, 2]
    assert ids(1000, "alice", users=["alice"]) == [1, 2]
    assert ids(1000, "alice", jobs=[bob, 1]) == [1]          # bob's job is left out
    with pytest.raises(PermissionDenied, match="may see only its own usage, not bob's"):
        ids(1000, "alice", users=["bob"])
    assert ids(0, "root") == [1, 2, bob]
    assert ids(0, "root", users=["bob"]) == [bob]
    assert ids(0, "root", start_s=5.5 * H) == [1, 2, bob]    # 1, 2 still running
    _end(store, 1, 2 * H)
    assert ids(0, "root", start_s=3 * H) == [2, bob]
    assert ids(0, "root", end_s=4 * H) == [1, 2]             # bob submitted later
    rec = sacct(store, site, 1000, "alice", {0}, {"jobs": [2]}, 6 * H)["jobs"][0]
    assert rec["slurm_job_ids"] == ["101", "102"] and rec["gpu_s"]["train"] == \
        pytest.approx(4 * H)


def test_weaveds_group_runtime_is_a_span_source() -> None:
    """The meter reads phase times from GroupRuntime.spans; a driver without a timeline
    (the idle driver) books allocations only."""
    from weave_slurm.daemon.driver import IdleDriver
    from weave_slurm.daemon.group_runtime import GroupRuntime
    from weave_slurm.daemon.usage_meter import SpanSource

    assert isinstance(GroupRuntime(lambda *a: None), SpanSource)  # type: ignore[arg-type,return-value]
    assert not isinstance(IdleDriver(), SpanSource)
