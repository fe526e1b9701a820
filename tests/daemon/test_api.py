"""The socket API with a real second Unix user (fork + setuid to nobody)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.daemon.conftest import Running
from tests.harness.specs import typed, with_output
from tests.harness.waits import wait_for
from tests.harness.weaved import call, state_of
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.api import weights_view
from weave_slurm.daemon.fault_points import FaultPoint
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import JobRow
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import ConfigError, ExternalCommandError, InfeasibleRequest, WeaveError
from weave_slurm.model.profile import simple_profile

NOBODY = 65534


def as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a child process with ``uid``; returns its JSON result or error text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, call, report, exit without cleanup
        os.close(r)
        try:
            os.setgid(uid)
            os.setuid(uid)
            out: Any = {"ok": fn()}
        except WeaveError as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        except BaseException as exc:
            out = {"error": "crash", "message": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid")
def test_second_user_cannot_touch_first_users_job(weaved: Running) -> None:
    sock = weaved.socket
    mine = call(sock, Op.SUBMIT, spec=job_spec_toml("root-job"), source="r.toml")["job"]
    spec = with_output(job_spec_toml("nobody-job"), weaved.state_dir.parent)   # as root
    theirs = as_user(NOBODY, lambda: call(sock, Op.SUBMIT, spec=spec,
                                          source="n.toml"))["ok"]["job"]
    wait_for(lambda: state_of(sock, mine) == "RUNNING" and state_of(sock, theirs) == "RUNNING",
             20, "both jobs running")
    rows = {j["job"]: j for j in call(sock, Op.STATUS)["jobs"]}
    assert rows[theirs]["uid"] == NOBODY and rows[theirs]["user"] == "nobody"
    assert rows[mine]["group"] == rows[theirs]["group"]  # co-scheduled in one group

    denied = as_user(NOBODY, lambda: call(sock, Op.CANCEL, jobs=[mine]))["ok"]["results"][0]
    assert not denied["ok"] and "permission denied" in denied["message"]
    shown = as_user(NOBODY, lambda: call(sock, Op.SHOW, kind="job", id=mine))
    assert shown["error"] == "PermissionDenied"
    assert state_of(sock, mine) == "RUNNING"

    own = as_user(NOBODY, lambda: call(sock, Op.CANCEL, jobs=[theirs]))["ok"]["results"][0]
    assert own["ok"]
    wait_for(lambda: state_of(sock, theirs) == "CANCELLED", 20, "nobody's job cancelled")
    assert state_of(sock, mine) == "RUNNING"
    assert call(sock, Op.SHOW, kind="job", id=theirs)["uid"] == NOBODY  # root sees all
    res = call(sock, Op.CANCEL, jobs=[mine, 999])["results"]
    assert res[0]["ok"] and "Invalid job id" in res[1]["message"]


def test_invalid_submissions_leave_nothing_behind(weaved: Running) -> None:
    sock = weaved.socket
    with pytest.raises(ConfigError, match="slo"):
        call(sock, Op.SUBMIT, spec=job_spec_toml("x", slo=0.5))
    with pytest.raises(ConfigError, match="unknown"):
        call(sock, Op.SUBMIT, spec=job_spec_toml("x") + "bogus_key = 1\n")
    huge = job_spec_toml("x", rollout_state_gib=99999.0)
    with pytest.raises(InfeasibleRequest, match="rollout state"):
        call(sock, Op.SUBMIT, spec=huge)
    too_many = job_spec_toml("x", rollout_gpus=64)
    with pytest.raises(InfeasibleRequest):
        call(sock, Op.SUBMIT, spec=too_many)
    assert call(sock, Op.STATUS, all=True)["jobs"] == []


def test_protocol_limits_and_slow_clients(weaved: Running) -> None:
    sock = weaved.socket
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(sock))  # says nothing: must not stall anyone
    assert call(sock, Op.PING)["uid"] == os.geteuid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(b"{not json}\n")
        assert json.loads(s.makefile().readline())["error"] == "ConfigError"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(b"x" * (300 * 1024))
        assert json.loads(s.makefile().readline())["error"] == "LineTooLong"
    idle.settimeout(5)
    assert idle.recv(10) == b""  # closed by the daemon after client_timeout_s
    idle.close()
    with pytest.raises(ConfigError, match="kind"):
        call(sock, Op.SHOW, kind="nope", id=1)


def test_status_warns_while_slurms_state_cannot_be_read(
        weaved: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing or hung squeue skips reconcile ticks; status says so, then stops."""
    def hung(prefix: str, *, instance: str | None = None) -> list[Any]:
        raise ExternalCommandError(["squeue", "--json"], None, "", "", "command timed out")
    monkeypatch.setattr(weaved.weaved.backend, "list_allocations", hung)
    wait_for(lambda: call(weaved.socket, Op.STATUS)["warnings"], 20, "a status warning")
    (warning,) = call(weaved.socket, Op.STATUS)["warnings"]
    assert warning.startswith("weaved cannot read Slurm's state for ") and \
        "squeue --json" in warning and "\n" not in warning, warning
    monkeypatch.undo()
    wait_for(lambda: call(weaved.socket, Op.STATUS)["warnings"], 20, "no status warning",
             until=lambda warnings: warnings == [])


def test_a_status_read_while_a_job_leaves_sees_it_in_its_group_or_ended(
        weaved: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job leaving takes two writes (its group's plan, then its state). A status read
    between them saw it still running but no longer pinned, its rollout nodes unnamed
    (CI failed on it once): the read waits for the job's leaving to end."""
    sock = weaved.socket
    job = call(sock, Op.SUBMIT, spec=job_spec_toml("leaving"), source="l.toml")["job"]
    wait_for(lambda: state_of(sock, job) == "RUNNING", 20, "the job running")
    seen: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: seen.extend(
        r for r in call(sock, Op.STATUS, jobs=[job])["jobs"]))

    def between(point: FaultPoint) -> None:   # in the tick, after the plan's write
        if point is FaultPoint.CANCEL_STOPPED and reader.ident is None:   # not started
            reader.start()
            reader.join(1.0)   # a read that does not wait answers well within this

    monkeypatch.setattr("weave_slurm.daemon.reconcile.crossing", between)
    assert call(sock, Op.CANCEL, jobs=[job])["results"][0]["ok"]
    wait_for(lambda: state_of(sock, job) == "CANCELLED", 20, "the job cancelled")
    reader.join(10)
    assert [r["state"] for r in seen] == ["CANCELLED"], seen


def test_jobs_released_in_one_call_are_seen_released_together(
        weaved: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """`weave release 1 2 3` releases the three as one: a tick between two of the
    writes placed the first alone (a pool sized for one, which the others then joined:
    CI failed on it once, tests/runtime/test_weaved_pooled.py). A reader of the store
    between the first write and the last waits for the last."""
    sock = weaved.socket
    spec = job_spec_toml("held") + "\n[slurm]\nhold = true\n"
    jobs = [call(sock, Op.SUBMIT, spec=spec, source="h.toml")["job"] for _ in range(3)]
    store = weaved.weaved.store
    seen: list[list[bool]] = []
    reader = threading.Thread(target=lambda: seen.append(
        [j.held for j in store.jobs() if j.job_id in jobs]))
    update = store.update

    def first_then_read(entity: str, key: int, **fields: Any) -> None:
        update(entity, key, **fields)
        if reader.ident is None:   # after the first job's write
            reader.start()
            reader.join(0.5)   # a read that does not wait answers well within this

    monkeypatch.setattr(store, "update", first_then_read)
    assert all(r["ok"] for r in call(sock, Op.RELEASE, jobs=jobs)["results"])
    reader.join(10)
    assert seen == [[False, False, False]], seen


def test_a_job_without_a_weights_digest_says_why_in_words() -> None:
    """``weave show job``'s ``weights_sha256``: the stored digest, else why there is none
    (a cooperative job's weights are its own; a job still running; one that failed)."""
    hosted = JobRow(1, 0, "root", "a", *typed(job_spec_toml("a")), "a.toml",
                    simple_profile("a", 1, 1, 1.5), JobState.COMPLETED, "", 1, 0.0, 1.0, 2.0,
                    weights_sha256="ab" * 32)
    assert weights_view(hosted) == {"weights_sha256": "ab" * 32}
    coop_spec, coop_toml = typed(hosted.spec_toml + '\n[launch]\nscript = "python t.py"\n')
    coop = replace(hosted, weights_sha256=None, spec=coop_spec, spec_toml=coop_toml)
    assert weights_view(coop)["weights_sha256_why"] == \
        "none: a cooperative job's weights are its own; weave holds none"
    for state, why in ((JobState.RUNNING, "none: known once it completes"),
                       (JobState.FAILED, "none: it ended FAILED")):
        view = weights_view(replace(hosted, weights_sha256=None, state=state))
        assert view == {"weights_sha256": None, "weights_sha256_why": why}
