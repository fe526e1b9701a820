"""daemon/job_output.py: a hosted job's --output/--error get its events (state changes with
their reasons, its training steps), the files opened as the job's uid."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_job_terms import _submit
from tests.daemon.test_reconcile import Rig, _job_state, rig  # noqa: F401
from weave_slurm.daemon.states import JobState
from weave_slurm.node.open_as import open_as


def _plain(uid: int, path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def test_output_gets_each_state_change_and_error_the_failures(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    rig.rec.outputs.opener = _plain
    logs = tmp_path / "logs"
    logs.mkdir()
    out, err = logs / "a-%j.out", logs / "a-%j.err"
    job = _submit(rig.store, "a", f'time_limit_min = 1\noutput = "{out}"\nerror = "{err}"')
    quiet = _submit(rig.store, "b")   # names no file: none is written
    rig.tick()
    assert _job_state(rig.store, job) is JobState.RUNNING
    text = (logs / f"a-{job}.out").read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in text] == [
        "PENDING: submitted by uid 1000", "PLACED: new_group into group 1",
        "RUNNING: 2 step(s) launched"]
    assert all(f" weave job {job} (a): " in line for line in text)
    assert (logs / f"a-{job}.err").read_text() == ""
    rig.tick(at=rig.clock.now() + 61)
    assert _job_state(rig.store, job) is JobState.FAILED
    last = (logs / f"a-{job}.out").read_text().splitlines()[-1]
    assert "FAILED: reached its time limit (1 min" in last
    assert (logs / f"a-{job}.err").read_text().splitlines() == [last]
    rig.tick(at=rig.clock.now() + 1)   # closed: nothing more is written
    assert (logs / f"a-{job}.out").read_text().splitlines()[-1] == last
    assert sorted(p.name for p in logs.iterdir()) == [f"a-{job}.err", f"a-{job}.out"]
    assert _job_state(rig.store, quiet) is JobState.RUNNING


def _reporting(rig: Rig, iterations: int, terms: str) -> tuple[dict[str, Any], int]:  # noqa: F811
    """A job submitted with ``terms`` and ticked once; the runtime's report of it, to
    update (its version, reward, event)."""
    rig.rec.outputs.opener = _plain
    live: dict[str, Any] = {"version": 0, "iterations": iterations, "reward": None,
                            "event": None, "error": None}
    rig.rec.outputs.live = lambda job_id: dict(live)
    job = _submit(rig.store, "a", terms)
    rig.tick()
    return live, job


def test_without_error_everything_is_in_output_and_steps_are_written(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    live, job = _reporting(rig, 3, f'output = "{tmp_path}/%x.%j.log"')
    live.update(version=1, reward=0.25)
    rig.tick(at=rig.clock.now() + 1)
    rig.tick(at=rig.clock.now() + 1)   # the same step is not written twice
    live.update(version=2, reward=0.5, event="recovered from node checkpoint")
    rig.tick(at=rig.clock.now() + 1)
    lines = [line.split(": ", 1)[1] for line in
             (tmp_path / f"a.{job}.log").read_text().splitlines()]
    assert lines[3:] == ["step 1/3 reward 0.2500", "step 2/3 reward 0.5000",
                         "event: recovered from node checkpoint"]


def test_a_step_taken_in_the_tick_a_job_ends_is_written_before_its_end(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    live, job = _reporting(rig, 500, f'time_limit_min = 1\noutput = "{tmp_path}/o"')
    live.update(version=1, reward=0.25)   # its first step, then its time is up
    rig.tick(at=rig.clock.now() + 61)
    assert _job_state(rig.store, job) is JobState.FAILED
    lines = [line.split(": ", 1)[1] for line in (tmp_path / "o").read_text().splitlines()]
    assert lines[-2:][0] == "step 1/500 reward 0.2500"
    assert lines[-1].startswith("FAILED: reached its time limit (1 min")


def test_a_restarted_weaved_writes_no_line_twice(rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    rig.rec.outputs.opener = _plain
    job = _submit(rig.store, "a", f'output = "{tmp_path}/o"')
    rig.tick()
    before = (tmp_path / "o").read_text()
    rig.restart()
    rig.rec.outputs.opener = _plain
    rig.tick(at=rig.clock.now() + 1)
    assert (tmp_path / "o").read_text() == before and _job_state(rig.store, job) \
        is JobState.RUNNING


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_the_file_is_opened_as_the_jobs_user(public_dir: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    public = public_dir / "pub"
    public.mkdir()
    public.chmod(0o777)
    fd = open_as(nobody, str(public / "o.log"))
    os.write(fd, b"x\n")
    os.close(fd)
    st = (public / "o.log").stat()
    assert st.st_uid == nobody and st.st_mode & 0o777 == 0o644
    private = public_dir / "root-only"
    private.mkdir(mode=0o700)
    with pytest.raises(PermissionError, match="opened as uid"):
        open_as(nobody, str(private / "o.log"))
    assert not (private / "o.log").exists()


def test_a_cooperative_jobs_files_are_left_to_its_own_processes(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    opened: list[str] = []

    def record(uid: int, path: str) -> int:
        opened.append(path)
        return os.open(os.devnull, os.O_WRONLY)
    rig.rec.outputs.opener = record
    hosted = _submit(rig.store, "h", 'output = "out-%j.log"')   # relative: the user's home
    _submit(rig.store, "c", f'output = "{tmp_path}/c.log"\n\n[launch]\nscript = "echo hi"')
    rig.tick()
    try:
        home = pwd.getpwuid(1000).pw_dir + "/"
    except KeyError:   # no such user here: nothing to resolve against
        home = ""
    assert opened == [f"{home}out-{hosted}.log"]   # the cooperative job's: not by weaved
    assert not (tmp_path / "c.log").exists()


def test_an_output_file_that_cannot_be_opened_is_in_the_jobs_reason(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """weaved's warning about it is also the job's REASON (issue 30, item 5)."""
    def refuse(uid: int, path: str) -> int:
        raise PermissionError(f"{path}: opened as uid {uid}: permission denied")

    rig.rec.outputs.opener = refuse
    job = _submit(rig.store, "a", f'output = "{tmp_path}/a-%j.out"')
    rig.tick()
    row = rig.store.job(job)
    assert row is not None and row.state is JobState.RUNNING
    assert row.reason == (f"cannot open its output file: {tmp_path}/a-{job}.out: opened as "
                          "uid 1000: permission denied")
