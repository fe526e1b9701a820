"""weaved killed at every fault point of the control loop, 22 times in one run, and restarted.

The daemon is a real subprocess on the local backend (real processes for steps).
Each cycle starts it with ``WEAVE_FAULT_POINT=<point>:<n>`` so that it exits 137
(as if SIGKILLed) at the n-th crossing of that point while jobs are submitted and
cancelled; then a clean daemon is started on the same state, left to settle, and
checked; then that one is SIGKILLed too. Checked after every restart:

* every accepted job is listed exactly once (a job stored just before the kill, whose
  id the client never got, appears at most once under its unique name);
* the backend holds no allocation the store does not hold as HELD (no leak) and no
  name twice (no duplicate); every HELD row is listed by the backend;
* no job's state goes backwards and no final state changes; a running job keeps its
  group; ITER (weight version) never decreases; each job's transition log is a chain;
* a running job has exactly one step per pool in the backend, an ended job none.

At the end everything is cancelled and the backend must hold no allocation at all.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_restart import check_world, kill9, start
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.fault_points import ENV, EXIT_CODE, FaultPoint
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import WeaveError
from weave_slurm.slurm.local_backend import LocalBackend

RANK = {"PENDING": 0, "PLACED": 1, "RUNNING": 2, "CANCELLING": 3,
        "COMPLETED": 4, "FAILED": 4, "CANCELLED": 4, "REFUSED": 4}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "REFUSED"}
#: every point once, then the points a normal cycle crosses more than once a second time
#: (job.ended: these jobs never end; tests/reliability/test_slurm_faults.py crosses it)
SCHEDULE = [(p, 1) for p in FaultPoint if p is not FaultPoint.JOB_ENDED] + [(p, 2) for p in (
    FaultPoint.SUBMIT_STORED, FaultPoint.PLACE_COMMITTED, FaultPoint.STEP_INTENT,
    FaultPoint.STEP_LAUNCHED, FaultPoint.JOB_RUNNING, FaultPoint.CANCEL_STOPPING,
    FaultPoint.CANCEL_STOPPED, FaultPoint.ALLOC_INTENT, FaultPoint.RELEASE_INTENT)]


@dataclass
class Ledger:
    """What the test knows it submitted and what it saw of each job."""

    accepted: dict[str, int] = field(default_factory=dict)  # name -> id
    maybe: set[str] = field(default_factory=set)  # names whose submit reply was lost
    seen: dict[int, dict[str, Any]] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)  # how each daemon died
    serial: int = 0

    def name(self) -> str:
        self.serial += 1
        return f"kl{self.serial}"


def _settled(sock: Path) -> bool:
    try:
        jobs = call(sock, Op.STATUS, all=True)["jobs"]
        groups = call(sock, Op.GROUPS)["groups"]
    except WeaveError:
        return False
    return all(j["state"] in ("RUNNING", "PENDING", *FINAL) for j in jobs) and \
        all(g["state"] == "ACTIVE" for g in groups)


def _submit_and_cancel(sock: Path, ledger: Ledger, everything: bool) -> None:
    """Two submissions, then cancel every live job but the newest two (or all of them:
    groups empty out, so allocations are released and new ones asked for)."""
    for _ in range(2):
        name = ledger.name()
        try:
            ledger.accepted[name] = call(sock, Op.SUBMIT, spec=job_spec_toml(name))["job"]
        except WeaveError:
            ledger.maybe.add(name)
            return
    time.sleep(0.2)
    try:
        live = sorted(j["job"] for j in call(sock, Op.STATUS)["jobs"] if j["state"] not in FINAL)
        doomed = live if everything else live[:-2]
        if doomed:
            call(sock, Op.CANCEL, jobs=doomed)
    except WeaveError:
        return


def _check(state: Path, ledger: Ledger) -> None:
    sock = state / "weaved.sock"
    rows = call(sock, Op.STATUS, all=True)["jobs"]
    by_name: dict[str, list[int]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r["job"])
    for name in list(ledger.maybe):
        ids = by_name.get(name, [])
        assert len(ids) <= 1, f"job {name} stored twice: {ids}"
        if ids:
            ledger.accepted[name] = ids[0]
        ledger.maybe.discard(name)
    jobs = check_world(state, list(ledger.accepted.values()))
    for name, job_id in ledger.accepted.items():
        assert jobs[job_id]["name"] == name
    groups = call(sock, Op.GROUPS)["groups"]
    held = {a["id"] for g in groups for a in g["allocations"] if a["state"] == "HELD"}
    backend = LocalBackend(state / "local")
    listed = {a.alloc_id for a in backend.list_allocations()}
    assert held <= listed, f"store holds {held - listed}, the backend does not list them"
    steps = [s.name for a in backend.list_allocations() for s in backend.list_steps(a.alloc_id)]
    for job_id, j in jobs.items():
        old = ledger.seen.get(job_id)
        if old is not None:
            assert RANK[str(j["state"])] >= RANK[str(old["state"])], f"job {job_id} went back"
            assert old["state"] not in FINAL or j["state"] == old["state"]
            if old["state"] == "RUNNING" and j["state"] == "RUNNING":
                assert j["group"] == old["group"], f"job {job_id} changed group while running"
            if old["iter"] is not None:
                assert j["iter"] is not None and j["iter"] >= old["iter"]
        mine = sum(n.startswith(f"weave-j{job_id}-") for n in steps)
        if j["state"] == "RUNNING":  # PLACED and CANCELLING jobs may be between the two
            assert mine == 2, f"running job {job_id} has {mine} steps, not one per pool"
        elif j["state"] == "PENDING" or j["state"] in FINAL:
            assert mine == 0, f"{j['state']} job {job_id} still has {mine} steps"
        ledger.seen[job_id] = j
    for job_id in list(jobs)[-3:]:  # the transition log of the newest jobs is a chain
        log = call(sock, Op.SHOW, kind="job", id=job_id)["transitions"]
        assert all(a["dst"] == b["src"] for a, b in itertools.pairwise(log)), log


@pytest.fixture
def state(public_dir: Path) -> Iterator[Path]:
    s = public_dir / "state"
    yield s
    backend = LocalBackend(s / "local")
    for a in backend.list_allocations(""):
        backend.release(a.alloc_id)


def test_kill_at_every_fault_point(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    sock = state / "weaved.sock"
    for point, nth in SCHEDULE:
        monkeypatch.setenv(ENV, f"{point.value}:{nth}")
        proc = start(state)
        monkeypatch.delenv(ENV)
        deadline, rounds = time.monotonic() + 15.0, 0
        while proc.poll() is None and time.monotonic() < deadline:
            _submit_and_cancel(sock, ledger, everything=rounds % 2 == 1)
            rounds += 1
            time.sleep(0.2)
        if proc.poll() is None:
            kill9(proc)
            ledger.kills["timed SIGKILL (point not crossed)"] = \
                ledger.kills.get("timed SIGKILL (point not crossed)", 0) + 1
        else:
            assert proc.returncode == EXIT_CODE, proc.stderr.read() if proc.stderr else ""
            ledger.kills[point.value] = ledger.kills.get(point.value, 0) + 1
        proc = start(state)
        wait_for(lambda: _settled(sock), 20, "weaved settled after the restart")
        _check(state, ledger)
        kill9(proc)
    proc = start(state)
    try:
        wait_for(lambda: _settled(sock), 20, "weaved settled")
        _check(state, ledger)
        live = [j["job"] for j in call(sock, Op.STATUS)["jobs"]]
        if live:
            call(sock, Op.CANCEL, jobs=live)
        wait_for(lambda: not call(sock, Op.STATUS)["jobs"] and not call(sock, Op.GROUPS)["groups"],
                 20, "no live job and no group")
        time.sleep(0.3)
        assert not LocalBackend(state / "local").list_allocations(""), "allocation leaked"
    finally:
        kill9(proc)
    fault_kills = sum(v for k, v in ledger.kills.items() if not k.startswith("timed"))
    print(f"kills: {ledger.kills}; jobs: {len(ledger.accepted)}")
    assert fault_kills >= 20, ledger.kills
    assert len(ledger.accepted) >= 20
