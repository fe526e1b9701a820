"""The node daemon's allocation watch (slurm/allocation_watch.py): only a definite answer
from Slurm that its job ended makes it exit; no answer never does."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from weave_slurm.slurm.allocation_watch import (
    DEFAULT_INTERVAL_S,
    ENV_INTERVAL,
    FINAL_STATES,
    AllocationWatch,
    Verdict,
    ask,
    interval_from,
    start_watch,
)
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner

SQUEUE = ("squeue", "-h", "-j", "42", "-o", "%T")


def runner(reply: FakeReply) -> FakeRunner:
    fake = FakeRunner()
    fake.on(["squeue"], reply)
    return fake


@pytest.mark.parametrize("state", ["RUNNING", "SUSPENDED", "PENDING"])
def test_a_live_job_is_running(state: str) -> None:
    fake = runner(FakeReply(stdout=f"{state}\n"))
    answer = ask(fake, "42")
    assert answer.verdict is Verdict.RUNNING and answer.detail == state
    assert fake.argvs() == [SQUEUE]


@pytest.mark.parametrize("state", [*sorted(FINAL_STATES), "COMPLETING"])
def test_a_final_or_ending_state_is_gone(state: str) -> None:
    answer = ask(runner(FakeReply(stdout=f"{state}\n")), "42")
    assert answer.verdict is Verdict.GONE and state in answer.detail


def test_an_unknown_job_or_an_empty_listing_is_gone() -> None:
    unknown = FakeReply(stderr="slurm_load_jobs error: Invalid job id specified\n",
                        returncode=1)
    answer = ask(runner(unknown), "42")
    assert answer.verdict is Verdict.GONE and "Invalid job id" in answer.detail
    assert ask(runner(FakeReply(stdout="")), "42").verdict is Verdict.GONE


@pytest.mark.parametrize("reply", [
    FakeReply(hang=True),
    FakeReply(stderr="slurm_load_jobs error: Unable to contact slurm controller "
                     "(connect failure)\n", returncode=1),
    FakeReply(stderr="squeue: error: Socket timed out on send/recv operation\n",
              returncode=1),
    FakeReply(returncode=127, stderr="cannot start 'squeue'"),
])
def test_no_answer_is_not_gone(reply: FakeReply) -> None:
    assert ask(runner(reply), "42").verdict is Verdict.NO_ANSWER


def test_the_watch_ends_only_at_a_definite_answer(caplog: pytest.LogCaptureFixture) -> None:
    """RUNNING, no answer (cut off), no answer, RUNNING, gone: one exit, after the
    last; its log line says why."""
    script = [FakeReply(stdout="RUNNING\n"), FakeReply(hang=True),
              FakeReply(returncode=1, stderr="Unable to contact slurm controller"),
              FakeReply(stdout="RUNNING\n"), FakeReply(stdout="NODE_FAIL\n")]
    fake = FakeRunner()
    fake.on(["squeue"], lambda argv: script.pop(0))
    reasons: list[str] = []
    watch = AllocationWatch("42", 5.0, reasons.append, runner=fake)
    caplog.set_level(logging.INFO, "weave_slurm.slurm.allocation_watch")
    verdicts = [watch.check().verdict for _ in range(4)]
    assert verdicts == [Verdict.RUNNING, Verdict.NO_ANSWER, Verdict.NO_ANSWER,
                        Verdict.RUNNING]
    assert reasons == [] and watch.gone is None
    assert watch.check().verdict is Verdict.GONE
    assert reasons == ["job 42 is NODE_FAIL"]
    exits = [r.getMessage() for r in caplog.records if "exits" in r.getMessage()]
    assert exits == ["node daemon exits: its allocation no longer runs (job 42 is "
                     "NODE_FAIL)"]
    no_answer = [r for r in caplog.records if "no answer" in r.getMessage()]
    assert len(no_answer) == 1   # one line per run of silence, not one per check


def test_the_thread_calls_on_gone_once_and_stops() -> None:
    fake = runner(FakeReply(stderr="Invalid job id specified", returncode=1))
    gone = threading.Event()
    reasons: list[str] = []

    def on_gone(reason: str) -> None:
        reasons.append(reason)
        gone.set()
    watch = start_watch({"SLURM_JOB_ID": "42"}, 0.01, on_gone, runner=fake)
    assert watch is not None
    assert gone.wait(5)
    assert watch._thread is not None
    watch._thread.join(5)
    assert not watch._thread.is_alive() and len(reasons) == 1


def test_off_without_a_job_id_or_with_interval_zero() -> None:
    fake = FakeRunner()   # any command would raise UnexpectedCommand
    assert start_watch({}, 30, lambda r: None, runner=fake) is None
    assert start_watch({"SLURM_JOB_ID": "42"}, 0, lambda r: None, runner=fake) is None
    assert fake.calls == []


def test_interval_from_flag_env_default() -> None:
    assert interval_from(None, {}) == DEFAULT_INTERVAL_S
    assert interval_from(None, {ENV_INTERVAL: "5"}) == 5.0
    assert interval_from(0, {ENV_INTERVAL: "5"}) == 0.0   # the flag wins (local backend)
    assert interval_from(None, {ENV_INTERVAL: "soon"}) == 0.0


@pytest.mark.parametrize("remote", [False, True])
def test_weaveds_node_command_watches_often_on_the_local_backend(
        remote: bool, tmp_path: Path) -> None:
    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.node_daemons import LOCAL_WATCH_S, NodeDaemons, NodeDaemonSettings
    from weave_slurm.daemon.records import AllocRow
    from weave_slurm.daemon.states import AllocState

    alloc = AllocRow(1, 1, "rollout", "h20-0", "h20", 1, 8, None, 2, AllocState.HELD,
                     "7", ("h20-0",), "")
    nodes = NodeDaemons(NodeDaemonSettings(tmp_path, remote=remote), default_site(),
                        None)  # type: ignore[arg-type]   # command() asks no backend
    argv = nodes.command(alloc)
    if remote:   # Slurm: the default interval, or $WEAVE_NODE_ALLOCATION_WATCH_S
        assert "--allocation-watch-s" not in argv
    else:
        # its state file, read every LOCAL_WATCH_S (cheap), not squeue
        assert argv[argv.index("--allocation-watch-s") + 1] == f"{LOCAL_WATCH_S:g}"


def test_ended_now_asks_once_and_calls_nothing() -> None:
    """What a node daemon stopped by a signal asks: is this the end of its allocation?"""
    called: list[str] = []
    for reply, ended in [(FakeReply(stdout="NODE_FAIL\n"), "job 42 is NODE_FAIL"),
                         (FakeReply(stdout="RUNNING\n"), None),
                         (FakeReply(hang=True), None)]:
        fake = runner(reply)
        watch = AllocationWatch("42", 30, called.append, runner=fake)
        assert watch.ended_now(timeout_s=0.5) == ended
        assert fake.argvs() == [SQUEUE] and watch.gone is None
    assert called == []
