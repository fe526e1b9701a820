"""The store and the one transition table: legal edges persist, illegal ones raise."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.old_store import make_old
from tests.harness.specs import stored
from weave_slurm.daemon.records import GroupPlan, MemberPlan
from weave_slurm.daemon.states import (
    TRANSITIONS,
    AllocState,
    GroupState,
    JobState,
    StepRunState,
    check_transition,
)
from weave_slurm.daemon.store import Store
from weave_slurm.errors import StateError
from weave_slurm.model.profile import simple_profile


def _job(store: Store, now: float = 1.0) -> int:
    return store.add_job(uid=1000, user="alice", name="a", **stored("a"), source="a.toml",
                         profile=simple_profile("a", 10, 10, 1.5), now=now)


def test_every_edge_has_a_comment_and_finals_have_no_exit() -> None:
    for (src, dst), why in TRANSITIONS.items():
        assert type(src) is type(dst) and why
    for kind in (JobState, GroupState, AllocState, StepRunState):
        for s in kind:
            if s.final:
                assert not any(src is s for src, _ in TRANSITIONS)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(JobState)), min_size=1, max_size=8))
def test_random_job_walks(tmp_path_factory: pytest.TempPathFactory,
                          walk: list[JobState]) -> None:
    store = Store(tmp_path_factory.mktemp("db") / "w.db")
    job = _job(store)
    state, history = JobState.PENDING, [JobState.PENDING]
    for t, dst in enumerate(walk, start=2):
        if (state, dst) in TRANSITIONS:
            store.transition("job", job, dst, "walk", float(t))
            state = dst
            history.append(dst)
        else:
            with pytest.raises(StateError, match="illegal JobState transition"):
                store.transition("job", job, dst, "walk", float(t))
    row = store.job(job)
    assert row is not None and row.state is state
    assert [JobState(t.dst) for t in store.transitions("job", job)] == history


def test_compare_and_set_refuses_a_stale_expectation(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _job(store)
    store.transition("job", job, JobState.CANCELLED, "user", 2.0, expect=JobState.PENDING)
    with pytest.raises(StateError, match="changed meanwhile"):
        store.transition("job", job, JobState.REFUSED, "placement", 3.0,
                         expect=JobState.PENDING)


def test_state_survives_reopen_and_placement_is_atomic(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    a, b = _job(store), _job(store)
    store.transition("job", b, JobState.CANCELLED, "user", 2.0)
    plan = GroupPlan(1, 1, (MemberPlan(a, (0,)), MemberPlan(b, (0,))))
    with pytest.raises(StateError):  # b is cancelled: nothing of the placement is written
        store.commit_placement([(1, "1", plan, True)], [(a, 1, "x"), (b, 1, "x")], 3.0)
    assert store.groups() == []
    store.commit_placement([(1, "1", GroupPlan(1, 1, (MemberPlan(a, (0,)),)), True)],
                           [(a, 1, "new group")], 3.0)
    store.close()
    again = Store(tmp_path / "w.db")
    row = again.job(a)
    assert row is not None and row.state is JobState.PLACED and row.group_id == 1
    assert again.groups()[0].plan.job_ids == (a,)


def test_a_jobs_weights_digest_is_written_with_its_end_and_survives_reopen(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    a = _job(store)
    store.commit_placement([(1, "1", GroupPlan(1, 1, (MemberPlan(a, (0,)),)), True)],
                           [(a, 1, "new group")], 2.0)
    store.transition("job", a, JobState.RUNNING, "started", 3.0)
    store.transition("job", a, JobState.COMPLETED, "done", 4.0, ended_s=4.0,
                     weights_sha256="ab" * 32)
    store.close()
    again = Store(tmp_path / "w.db")
    row = again.job(a)
    assert row is not None and row.state is JobState.COMPLETED
    assert row.weights_sha256 == "ab" * 32


def test_a_schema_4_file_is_migrated_and_its_jobs_have_no_digest(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    store = Store(db)
    a = _job(store)
    store.close()
    make_old(db, 4)   # what a weaved of schema 4 left behind
    row = Store(db).job(a)
    assert row is not None and row.weights_sha256 is None


def test_a_jobs_recoveries_are_stored_and_a_schema_7_file_counts_none(
        tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    store = Store(db)
    a = _job(store)
    store.close()
    make_old(db, 7)   # what a weaved of schema 7 left behind: no count
    store = Store(db)
    row = store.job(a)
    assert row is not None and row.recoveries == 0
    store.set_recoveries(a, 5)
    store.close()
    row = Store(db).job(a)
    assert row is not None and row.recoveries == 5
    with pytest.raises(StateError, match="job 999 does not exist"):
        Store(db).set_recoveries(999, 1)


def test_corrupt_or_foreign_database_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StateError, match="unreadable or corrupt"):
        Store(bad)
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(StateError, match="not a weaved state database"):
        Store(other)
    newer = tmp_path / "newer.db"
    Store(newer).close()
    con = sqlite3.connect(newer)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StateError, match="schema version '99'"):
        Store(newer)


def test_check_transition_lists_the_legal_targets() -> None:
    with pytest.raises(StateError, match=r"only: \['ALLOCATING', 'RELEASED'\]"):
        check_transition(AllocState.WANTED, AllocState.HELD)


def test_a_schema_5_file_gets_its_specs_parsed_once_more(tmp_path: Path) -> None:
    """Schema 6 stores the spec parsed at submission: a file of schema 5 gets each stored
    text parsed once, when it is migrated; one this weave cannot read keeps no typed
    spec (its job goes on as one whose spec weaved cannot read) and its text."""
    db = tmp_path / "w.db"
    store = Store(db)
    a, b = _job(store), _job(store)
    store.close()
    make_old(db, 5)
    con = sqlite3.connect(db)
    con.execute("UPDATE jobs SET spec='name = \"b\"' WHERE job_id=?", (b,))
    con.commit()
    con.close()
    store = Store(db)
    old_a, old_b = store.job(a), store.job(b)
    assert old_a is not None and old_a.spec == stored("a")["spec"]
    assert old_b is not None and old_b.spec is None and old_b.spec_toml == 'name = "b"'


def test_jobs_by_id_in_one_query(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    ids = [_job(store) for _ in range(4)]
    assert [j.job_id for j in store.jobs(ids=[ids[3], ids[1], 999])] == [ids[1], ids[3]]
    assert store.jobs(ids=[]) == []
    store.close()
