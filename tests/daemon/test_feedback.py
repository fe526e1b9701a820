"""Live profiles fed back into placement: the stored measured profile changes decisions."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

from tests.harness.old_store import make_old
from tests.harness.specs import stored
from weave_slurm.daemon import membership
from weave_slurm.daemon.feedback import feed_back
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.schema import SCHEMA_VERSION
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.runtime.group import DeclaredProfile
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.vocab import Phase

CAP = Capacity(4, 8, 1000.0, 1000.0, 16, 16, CostRates(1.0, 2.85))


def _store_with_running_job(tmp_path: Path) -> tuple[Store, int]:
    store = Store(tmp_path / "w.db")
    job = store.add_job(uid=1000, user="alice", name="a", **stored("a"), source="a.toml",
                        profile=simple_profile("a", 10, 10, 1.5), now=1.0)
    store.commit_placement([(1, "1", GroupPlan(1, 1, (MemberPlan(job, (0,)),)), True)],
                           [(job, 1, "new group")], 2.0)
    return store, job


def _arrival_group(store: Store) -> int:
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 2)
    decision = place_batch(WeavePolicy(), state, [simple_profile("b", 10, 10, 1.5)]) \
        .decisions[0]
    assert isinstance(decision, Placement)
    return decision.group.group_id


def test_measured_profile_is_stored_and_changes_the_next_decision(tmp_path: Path) -> None:
    store, job = _store_with_running_job(tmp_path)
    # declared 10 s / 10 s: an identical arrival packs into the group (period 20 s)
    assert _arrival_group(store) == 1
    # the runtime measures its rollouts at 25 s: the arrival would push the group's
    # period past the newcomer's budget, so it gets a group of its own
    prof = LiveProfiler()
    prof.track(str(job), DeclaredProfile(10.0, 10.0, 1.5))
    for _ in range(3):
        prof.phase(str(job), Phase.ROLLOUT, 25.0)
        prof.phase(str(job), Phase.TRAIN, 10.0)
    row = store.job(job)
    assert row is not None
    member = SimpleNamespace(measured=prof.snapshot()[str(job)])   # the port's snapshot
    feed_back(store, member, row)  # type: ignore[arg-type]
    row = store.job(job)
    assert row is not None and row.measured is not None
    assert row.measured.rollout_mean_s == 25.0 and row.profile.rollout_mean_s == 10.0
    assert row.plan_profile is row.measured
    assert _arrival_group(store) == 2
    # a second call with the same measurements writes nothing new
    member = SimpleNamespace(measured=prof.snapshot()[str(job)])   # the port's snapshot
    feed_back(store, member, row)  # type: ignore[arg-type]
    assert store.job(job) == row


def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    store, job = _store_with_running_job(tmp_path)
    store.close()
    make_old(db, 1)   # what a weaved of schema 1 left behind
    store = Store(db)
    row = store.job(job)
    assert row is not None and row.measured is None and row.state is JobState.PLACED
    store.set_measured(job, simple_profile("a", 12, 10, 1.5))
    assert store.job(job).measured is not None  # type: ignore[union-attr]
    con = sqlite3.connect(db)
    version = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),)
