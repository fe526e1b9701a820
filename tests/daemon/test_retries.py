"""The backoff and the node-daemon retry bound (pure, clock passed in), and reading a
step's last error line from its log."""

from __future__ import annotations

from pathlib import Path

from weave_slurm.daemon.records import AllocRow
from weave_slurm.daemon.retries import (
    NODE_DAEMON_STABLE_S,
    NODE_DAEMON_TRIES,
    RETRY_MAX_S,
    Backoff,
    NodeDaemonRetries,
    last_line,
)
from weave_slurm.daemon.states import AllocState

ALLOC = AllocRow(7, 1, "rollout", "h20-0", "h20", 1, 8, "h20", 2, AllocState.HELD, "11",
                 ("h20-0",), "")


def test_backoff_doubles_per_failure_up_to_the_cap_and_forgets() -> None:
    b = Backoff()
    assert b.ready(7, 0.0) and b.failures(7) == 0
    waits = [b.failed(7, 100.0)[1] for _ in range(6)]
    assert waits == [1.0, 2.0, 4.0, 8.0, RETRY_MAX_S, RETRY_MAX_S]
    assert b.failures(7) == 6 and not b.ready(7, 114.9) and b.ready(7, 115.0)
    assert b.ready(8, 100.0)   # per key
    b.forget(7)
    assert b.failures(7) == 0 and b.ready(7, 0.0)


def test_last_line_is_the_daemons_own_error_after_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    assert last_line(None) == "(no log)"
    assert last_line(log) == f"(no log at {log})"
    log.write_text("weave node serve: error: an old run's words\n")
    mark = log.stat().st_size
    log.write_text(log.read_text() + "weave node serve: listening on port 47001\n"
                   "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "StateError: shm root /dev/shm/w/h20-0 is held by pid 4242\n"
                   "srun: error: h20-0: task 0: Exited with exit code 1\n\n")
    assert last_line(log, mark) == "StateError: shm root /dev/shm/w/h20-0 is held by pid 4242"
    end = log.stat().st_size
    log.write_text(log.read_text() + "srun: error: h20-0: task 0: Exited with exit code 1\n")
    assert last_line(log, end) == "srun: error: h20-0: task 0: Exited with exit code 1"
    assert last_line(log, log.stat().st_size) == f"(nothing new in {log})"
    # a mark past the end (the log was replaced): its tail is read
    assert last_line(log, 10**9) == "StateError: shm root /dev/shm/w/h20-0 is held by pid 4242"


def test_node_daemon_retries_give_up_at_the_bound_and_heal_after_a_stable_run(
        tmp_path: Path) -> None:
    r = NodeDaemonRetries()
    log = tmp_path / "node.log"
    verdicts = []
    for i in range(NODE_DAEMON_TRIES):
        r.launching(ALLOC.key, log, float(i))
        with log.open("a") as fh:
            fh.write(f"weave node serve: error: try {i}\n")
        verdicts.append(r.failed(ALLOC, "exited with code 1", float(i), log))
    assert [v.give_up for v in verdicts] == [False] * (NODE_DAEMON_TRIES - 1) + [True]
    assert verdicts[1].reason == ("node daemon of rollout allocation 11 (h20-0) exited with "
                                  "code 1: weave node serve: error: try 1; failure 2 of 5, "
                                  "relaunching in 2 s")
    assert verdicts[-1].reason.endswith(f"try 4; gave up after 5 failures in a row (log: {log})")
    assert not r.failing(ALLOC.key)   # given up: forgotten
    said = r.failed(ALLOC, "could not be launched (srun: no such file)", 50.0).reason
    assert said.endswith("could not be launched (srun: no such file); failure 1 of 5, "
                         "relaunching in 1 s")
    r.launching(ALLOC.key, None, 51.0)
    assert r.steady(ALLOC.key, 51.0 + NODE_DAEMON_STABLE_S - 1) is None
    assert r.steady(ALLOC.key, 51.0 + NODE_DAEMON_STABLE_S) == said
    assert not r.failing(ALLOC.key) and r.steady(ALLOC.key, 1e9) is None
