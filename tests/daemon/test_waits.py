"""Nothing waits forever (daemon/waits.py): the deadlines of a group's start, by cause,
with a virtual clock; then the whole reconcile tick with the group runtime, a fake
runner answering with exact Slurm command lines, and node daemons that never become
reachable (no port said; munge failing against a real node-daemon door)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.clock import VirtualClock
from weave_slurm.config.runtime import RUNTIME_DEFAULTS
from weave_slurm.daemon.group_runtime import GroupRuntime, GroupRuntimeConfig
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, MemberPlan
from weave_slurm.daemon.states import GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.waits import Deadlines, GroupWaits, WaitCause, answer_cause, requeues
from weave_slurm.errors import AuthError, ConfigError, NodeGone, NodeUnavailable
from weave_slurm.node.auth import Munge
from weave_slurm.node.remote import RemoteDoor
from weave_slurm.runtime.group import NodeRef
from weave_slurm.slurm.fake_runner import FakeRunner
from weave_slurm.vocab import Pool

from .test_reconcile import T0, Rig, Slurm, _group, _job_state, _reconciler, _sbatch, _submit

SITE = replace(RUNTIME_DEFAULTS, node_start_wait_s=30.0, auth_wait_s=10.0, max_requeues=2)
DEADLINES = Deadlines(SITE)


def _row(jobs: tuple[int, ...], gid: int = 1) -> GroupRow:
    plan = GroupPlan(1, 1, tuple(MemberPlan(j, (0,)) for j in jobs))
    return GroupRow(gid, f"t1.{gid}", GroupState.ACTIVE, plan, T0, "")


def _running_job(store: Store, gid: int = 1) -> int:
    job = _submit(store)
    store.commit_placement([(gid, f"t1.{gid}", GroupPlan(1, 1, (MemberPlan(job, (0,)),)),
                             True)], [(job, gid, f"new_group into group {gid}")], T0)
    store.transition("job", job, JobState.RUNNING, "0 step(s) launched", T0)
    return job


# -- the rule, with a virtual clock -----------------------------------------------------


def test_causes_come_from_error_types_and_only_authentication_cannot_pass() -> None:
    assert answer_cause(AuthError("munge encode: Failed to access")) is WaitCause.AUTH
    assert answer_cause(ConfigError("libmunge.so.2 cannot be loaded")) is WaitCause.AUTH
    assert answer_cause(NodeGone("no node daemon at h20-0:1")) is WaitCause.NODE_SILENT
    assert answer_cause(OSError("reset")) is WaitCause.NODE_SILENT
    assert [c.passes for c in WaitCause] == [True, True, False]
    assert {c: c.key for c in WaitCause} == {
        WaitCause.NODE_PORT: "node_start_wait_s", WaitCause.NODE_SILENT: "node_start_wait_s",
        WaitCause.AUTH: "auth_wait_s"}


def test_a_node_daemon_that_never_answers_requeues_its_jobs_at_the_deadline(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _running_job(store)
    group, waits = _row((job,)), GroupWaits(DEADLINES)
    waits.wait(group, WaitCause.NODE_PORT, "the node daemon on h20-0 has not said its port "
               "yet", T0)
    assert waits.jobs[job] == ("the node daemon on h20-0 has not said its port yet "
                               "(node_start_wait_s: 30 s left)")
    # the cause changes (port said, no answer): the wait keeps its start
    waits.wait(group, WaitCause.NODE_SILENT, "no answer", T0 + 20)
    assert waits.jobs[job] == "no answer (node_start_wait_s: 30 s left)"
    waits.wait(group, WaitCause.NODE_PORT, "no port", T0 + 29)
    assert waits.overdue(store, T0 + 29.9) == []
    assert waits.jobs[job] == "no port (node_start_wait_s: 1 s left)"
    [out] = waits.overdue(store, T0 + 30)
    assert (out.job_id, out.state) == (job, JobState.PENDING)
    assert out.reason == ("requeued (1 of max_requeues = 2): group 1 could not reach its "
                          "node daemons within node_start_wait_s = 30 s: no port")
    assert job not in waits.jobs and waits.overdue(store, T0 + 99) == []   # said once


def test_a_group_that_reaches_its_nodes_in_time_is_not_judged(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _running_job(store)
    group, waits = _row((job,)), GroupWaits(DEADLINES)
    waits.wait(group, WaitCause.NODE_SILENT, "no answer", T0)
    waits.done(group)
    assert waits.jobs == {} and waits.overdue(store, T0 + 1000) == []
    waits.wait(group, WaitCause.NODE_SILENT, "no answer", T0 + 1000)   # a new wait: anew
    assert waits.overdue(store, T0 + 1029) == []


def test_munge_failing_fails_the_jobs_at_its_own_shorter_deadline(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _running_job(store)
    group, waits = _row((job,)), GroupWaits(DEADLINES)
    waits.wait(group, WaitCause.NODE_PORT, "no port", T0)
    waits.wait(group, WaitCause.AUTH, "munge encode: Failed to access", T0 + 25)
    assert waits.overdue(store, T0 + 34) == []   # timed from when munge first failed
    [out] = waits.overdue(store, T0 + 35)
    assert out.state is JobState.FAILED
    assert out.reason.startswith("group 1 could not reach its node daemons within "
                                 "auth_wait_s = 10 s: munge encode: Failed to access "
                                 "(authentication does not pass by itself")


def test_a_job_requeued_max_requeues_times_fails_with_the_count(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    job = _running_job(store)
    for n in range(2):
        store.transition("job", job, JobState.PENDING, f"requeued ({n + 1} of 2)", T0 + n)
        store.transition("job", job, JobState.PLACED, "new_group", T0 + n)
        store.transition("job", job, JobState.RUNNING, "0 step(s)", T0 + n)
    assert requeues(store, job) == 2
    waits = GroupWaits(DEADLINES)
    waits.wait(_row((job,)), WaitCause.NODE_SILENT, "no answer", T0)
    [out] = waits.overdue(store, T0 + 30)
    assert out.state is JobState.FAILED
    assert out.reason.endswith("no answer; requeued 2 time(s) already (max_requeues = 2)")


def test_a_moving_job_and_an_ended_one_are_left_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    moving, ended = _running_job(store), _running_job(store, 2)
    store.update("job", moving, moving_from=7)
    store.transition("job", ended, JobState.CANCELLING, "cancelled", T0)
    waits = GroupWaits(DEADLINES)
    waits.wait(_row((moving, ended)), WaitCause.NODE_SILENT, "no answer", T0)
    assert waits.overdue(store, T0 + 30) == [] and waits.jobs == {}


# -- the whole tick: group runtime, reconcile loop, Slurm's command lines ----------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """test_reconcile's rig (a real store, Slurm's exact command lines, a virtual clock)."""
    store, fake, clock = Store(tmp_path / "w.db"), FakeRunner(), VirtualClock(T0)
    yield Rig(store, fake, Slurm(fake), clock, _reconciler(store, fake, clock))
    store.close()


def _runtime(node_ref: Callable[[AllocRow, str, Pool], NodeRef],
             munge_socket: str | None = None) -> GroupRuntime:
    from weave_slurm.runtime.member import RunnerConfig

    return GroupRuntime(node_ref, GroupRuntimeConfig(
        ping_timeout_s=1.0, runner=RunnerConfig.from_site(SITE, munge_socket=munge_socket)))


def _no_port(alloc: AllocRow, node: str, pool: Pool) -> NodeRef:
    raise NodeUnavailable(f"the node daemon on {node} has not said its port yet")


def test_jobs_whose_node_daemons_never_say_their_port_are_requeued_then_failed(
        rig: Rig) -> None:
    driver = _runtime(_no_port)
    rig.restart(driver=driver)
    job = _submit(rig.store)
    rig.tick()   # placed, allocated, active, running (no step of its own)
    rig.tick()   # its group's runtime starts waiting for the node daemons
    assert _job_state(rig.store, job) is JobState.RUNNING
    assert driver.waiting(job) == ("the node daemon on h20-0 has not said its port yet "
                                   "(node_start_wait_s: 30 s left)")
    for n, (rollout, train) in enumerate([("11", "12"), ("13", "14")]):
        start = len(rig.fake.calls)
        rig.tick(at=rig.clock.now() + 29)
        assert _job_state(rig.store, job) is JobState.RUNNING and rig.argvs("scancel", start) == []
        rig.tick(at=rig.clock.now() + 1)   # the deadline: requeued, allocations returned,
        gid = n + 1                        # placed again in a new group, new allocations
        assert rig.argvs("scancel", start) == [("scancel", rollout), ("scancel", train)]
        assert rig.argvs("sbatch", start) == [_sbatch(f"weave-gt1.{gid + 1}-h20-0", "h20"),
                                              _sbatch(f"weave-gt1.{gid + 1}-h800-0", "h800")]
        assert _group(rig.store, gid).state is GroupState.RELEASED
        [*_, requeued, placed, running] = rig.reasons("job", job)
        assert requeued[:2] == ("RUNNING", "PENDING")
        assert requeued[2].startswith(f"requeued ({n + 1} of max_requeues = 2): group "
                                      f"{gid} could not reach its node daemons within "
                                      "node_start_wait_s = 30 s: the node daemon on "
                                      f"h20-{n} has not said its port yet")
        assert (placed[1], running[1]) == ("PLACED", "RUNNING")
        row = rig.store.job(job)
        assert row is not None and row.group_id == gid + 1
        rig.tick()
        assert driver.waiting(job)
    start = len(rig.fake.calls)
    rig.tick(at=rig.clock.now() + 30)
    row = rig.store.job(job)
    assert row is not None and row.state is JobState.FAILED
    assert row.reason.endswith("requeued 2 time(s) already (max_requeues = 2)")
    assert rig.argvs("scancel", start) == [("scancel", "15"), ("scancel", "16")]
    assert rig.slurm.jobs == {}   # nothing of weaved's left in Slurm


@pytest.fixture
def door() -> Iterator[tuple[str, int]]:
    """A real node-daemon network door (it sends its hello, then wants a credential)."""
    d = RemoteDoor(lambda *a: {}, "127.0.0.1", 0, Munge(), frozenset({0}), node="h20-0")
    thread = threading.Thread(target=d.serve, daemon=True)
    thread.start()
    yield str(d.address[0]), int(d.address[1])
    d.shutdown()
    thread.join(timeout=5)


def test_jobs_of_a_weaved_whose_munge_does_not_work_fail_naming_munge(
        rig: Rig, door: tuple[str, int], tmp_path: Path) -> None:
    def at_door(alloc: AllocRow, node: str, pool: Pool) -> NodeRef:
        return NodeRef(node, pool, tmp_path / "none.sock", door[0], door[1], alloc.alloc_id)

    driver = _runtime(at_door, munge_socket=str(tmp_path / "no-munged" / "munge.socket.2"))
    rig.restart(driver=driver)
    job = _submit(rig.store)
    rig.tick()
    rig.tick()
    words = driver.waiting(job)
    assert words is not None and "munge encode" in words and "auth_wait_s: 10 s left" in words
    rig.tick(at=T0 + 9)
    assert _job_state(rig.store, job) is JobState.RUNNING and rig.argvs("scancel") == []
    rig.tick(at=T0 + 10)
    row = rig.store.job(job)
    assert row is not None and row.state is JobState.FAILED
    assert "within auth_wait_s = 10 s" in row.reason and "munge encode" in row.reason
    assert rig.argvs("scancel") == [("scancel", "11"), ("scancel", "12")]
    assert rig.slurm.jobs == {}


def test_a_requeued_job_placed_again_still_shows_why_it_was_requeued(rig: Rig) -> None:
    """Placing a requeued job again clears its stored reason; its REASON keeps why it was
    requeued (as Slurm keeps a requeued job's Reason), ``requeues`` counts them (Slurm's
    Restarts) and ``weave show job`` lists each with its reason."""
    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.api import Api
    from weave_slurm.placement import Capacity

    driver = _runtime(_no_port)
    rig.restart(driver=driver)
    job = _submit(rig.store)
    rig.tick()
    rig.tick()
    rig.tick(at=rig.clock.now() + 30)   # requeued, placed again in group 2, running
    api = Api(rig.store, default_site(), Capacity.from_site(default_site()), rig.clock.now,
              waiting=driver.waiting)
    row = rig.store.job(job)
    assert row is not None and (row.state, row.group_id, row.reason) == \
        (JobState.RUNNING, 2, "")
    why = rig.reasons("job", job)[-3][2]
    assert why.startswith("requeued (1 of max_requeues = 2): group 1 could not reach")
    (shown,) = api.status({})["jobs"]
    assert shown["reason"] == why   # today: '' (placement cleared it)
    assert shown["requeues"] == 1
    rig.tick()   # its new group's runtime waits for the node daemons: that first, then why
    (shown,) = api.status({})["jobs"]
    assert shown["reason"] == f"waiting: {driver.waiting(job)}; {why}"
    details = api.show(0, "job", job)
    assert details["requeues"] == 1
    assert details["requeue_history"] == [{"ts": T0 + 30, "reason": why}]
    rig.tick(at=rig.clock.now() + 30)   # requeued again: both kept, the last one shown
    rig.tick()
    hist = api.show(0, "job", job)["requeue_history"]
    assert [h["reason"][:34] for h in hist] == ["requeued (1 of max_requeues = 2): ",
                                                "requeued (2 of max_requeues = 2): "]
    (shown,) = api.status({})["jobs"]
    assert shown["requeues"] == 2 and shown["reason"].endswith(hist[-1]["reason"])
    rig.tick(at=rig.clock.now() + 30)   # failed: REASON is why it ended, as before
    (shown,) = api.status({"all": True})["jobs"]
    assert shown["state"] == "FAILED" and shown["requeues"] == 2
    assert shown["reason"].endswith("requeued 2 time(s) already (max_requeues = 2)")
