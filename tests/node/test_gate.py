"""The node daemon's phase gate and launched processes (node/gate_ops.py), with the
gate SDK (weave_slurm.gate) on the job's side: a wait is seen by ``phase``, granted by
an external ``activate`` and reported ``exited`` with the job's result when the process
leaves its ``with`` block; a refusal and a revoked grant reach the process as typed
errors; another uid cannot gate the job (SO_PEERCRED); a launched process runs as the
job's uid and writes its output files."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import pid_alive
from tests.harness.scratch import public_dir
from tests.harness.waits import wait_for
from weave_slurm import gate
from weave_slurm.errors import ConfigError, GateRefused, PhaseRevoked
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op


def _call(sock: Path, op: Op, **args: Any) -> dict[str, Any]:
    with NodeClient(sock) as client:
        return client.call(op, **args)


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _waiting(sock: Path, job: str) -> dict[str, int]:
    return dict(_call(sock, Op.PHASE, job=job)["gate"]["waiting"])


def test_a_wait_is_granted_runs_and_ends_with_the_jobs_report(node: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c1")
    g = gate.connect(sock, "c1")
    hooks: list[str] = []
    g.switch_in.append(lambda t: hooks.append(f"in {t.phase} v{t.version}"))
    g.switch_out.append(lambda t: hooks.append(f"out {t.phase} v{t.version}"))

    def job() -> str:
        with g.phase("train", version=0) as turn:
            hooks.append("body")
            turn.report(reward_mean=0.5)
        return "left"
    thread, out = _in_thread(job)
    assert wait_for(lambda: _waiting(sock, "c1"), 10, "the process waits") == {"train": 0}
    assert _call(sock, Op.PHASE, job="c1")["worker"] is None   # nothing granted yet
    grant = _call(sock, Op.ACTIVATE, job="c1", phase="train", external=True, version=0,
                  step=0)
    assert grant["state"] == "running" and grant["external"]
    thread.join(10)
    assert out == {"value": "left"}
    assert hooks == ["in train v0", "body", "out train v0"]
    worker = _call(sock, Op.PHASE, job="c1")["worker"]
    assert worker["state"] == "exited"
    assert worker["result"]["version"] == 1 and worker["result"]["consumed"] == 0
    assert worker["result"]["metrics"] == {"reward_mean": 0.5}
    assert _waiting(sock, "c1") == {}


def test_a_refused_wait_raises_gate_refused_with_the_reason(node: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c2")
    thread, out = _in_thread(lambda: gate.connect(sock, "c2").acquire("train", 3))
    wait_for(lambda: _waiting(sock, "c2"), 10, "the process waits")
    # a refusal of another version than the one waited for is not delivered
    assert _call(sock, Op.GATE, job="c2", action="refuse", phase="train", version=2,
                 message="no")["refused"] is False
    assert _call(sock, Op.GATE, job="c2", action="refuse", phase="train", version=3,
                 message="train at version 3 refused: no rollout at version 3 ended")[
        "refused"] is True
    thread.join(10)
    error = out.get("error")
    assert isinstance(error, GateRefused), out
    assert str(error) == "train at version 3 refused: no rollout at version 3 ended"


def test_a_revoked_grant_refuses_the_jobs_done(node: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c3")
    g = gate.connect(sock, "c3")
    thread, out = _in_thread(lambda: g.acquire("rollout", 0))
    wait_for(lambda: _waiting(sock, "c3"), 10, "the process waits")
    _call(sock, Op.ACTIVATE, job="c3", phase="rollout", external=True, version=0, step=0)
    thread.join(10)
    turn = out["value"]
    assert isinstance(turn, gate.Turn)
    revoked = _call(sock, Op.DEACTIVATE, job="c3")
    assert revoked["state"] == "killed"
    with pytest.raises(PhaseRevoked, match="revoked"):
        g.release(turn)


def test_another_uid_cannot_gate_the_job(node: Any, run_as: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c4")          # root's job
    nobody = pwd.getpwnam("nobody").pw_uid

    def as_nobody() -> str:
        try:
            gate.connect(sock, "c4").acquire("rollout", 0)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "granted"
    out = run_as(nobody, as_nobody)
    assert out.startswith("StateError: uid ") and "may not touch job 'c4'" in out, out
    assert _waiting(sock, "c4") == {}
    # and nobody may not launch processes or refuse waits either
    assert "only weaved" in run_as(nobody, lambda: _refuse_as(sock))


def _refuse_as(sock: Path) -> str:
    try:
        _call(sock, Op.GATE, job="c4", action="refuse", phase="train", version=0,
              message="x")
    except Exception as exc:
        return str(exc)
    return "refused"


def test_a_launched_process_runs_as_the_job_owner_with_its_output_files(
        node: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another uid")
    with public_dir("weave-gate-") as root:
        _launch_as_nobody(node.config.socket, root)


def _launch_as_nobody(sock: Path, root: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    work = root / "work"
    work.mkdir()
    os.chown(work, nobody.pw_uid, nobody.pw_gid)
    _call(sock, Op.REGISTER, job="c5", uid=nobody.pw_uid)
    out, err = work / "out-c5.txt", work / "err-c5.txt"
    _call(sock, Op.LAUNCH, job="c5", action="start", role="train",
          command='echo "hello from $WEAVE_ROLE of $WEAVE_JOB_ID as $(id -u) in $PWD"; '
                  'echo "$SLURM_PROCID/$SLURM_NTASKS ${RANK:-none} $SLURM_JOB_NAME" '
                  '>&2; echo oops >&2; exit 3', env={"MINE": "1", "WEAVE_JOB_NAME": "mine"},
          workdir=str(work),
          output=str(out), error=str(err))
    procs = wait_for(lambda: _call(sock, Op.PHASE, job="c5")["gate"]["procs"], 10,
                     "the process exits",
                     until=lambda p: p.get("train", {}).get("returncode") is not None)
    assert procs["train"]["returncode"] == 3
    assert out.read_text() == f"hello from train of c5 as {nobody.pw_uid} in {work}\n"
    assert err.read_text() == "0/1 none mine\noops\n"   # Slurm's place; torchrun's: none
    assert (out.stat().st_uid, err.stat().st_uid) == (nobody.pw_uid, nobody.pw_uid)
    # an output file the job cannot create (opened as its uid, never as root): the launch
    # is refused in one line naming the file, and nothing is created there
    with pytest.raises(ConfigError, match=r"cannot open its rollout output file "
                       r"'.*not-yours.txt' as uid \d+: Permission denied"):
        _call(sock, Op.LAUNCH, job="c5", action="start", role="rollout", command="echo hi",
              workdir=str(work), output=str(root / "not-yours.txt"))
    assert not (root / "not-yours.txt").exists()
    assert "rollout" not in _call(sock, Op.PHASE, job="c5")["gate"]["procs"]


def test_importing_the_gate_does_not_import_torch() -> None:
    code = "import sys, weave_slurm.gate; print(sorted(m for m in sys.modules if m == " \
           "'torch' or m.startswith('torch.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_drop_stops_the_jobs_processes(node: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c6")
    pid = _call(sock, Op.LAUNCH, job="c6", action="start", role="train",
                command="trap '' TERM; sleep 60")["pid"]   # ignores SIGTERM: SIGKILL ends it
    assert _call(sock, Op.PHASE, job="c6")["gate"]["procs"]["train"]["returncode"] is None
    _call(sock, Op.DROP, job="c6")
    wait_for(lambda: not pid_alive(pid), 15, f"process {pid} gone after the drop")


def test_a_cooperative_job_has_no_resident_worker(resident_node: Any) -> None:
    sock = resident_node.config.socket
    _call(sock, Op.REGISTER, job="c7", resident=False)
    _call(sock, Op.REGISTER, job="h7")
    jobs = {j["job"]: j for j in _call(sock, Op.STATUS)["jobs"]}
    assert jobs["c7"]["resident"] is None and jobs["h7"]["resident"] is not None


def test_a_phase_whose_body_raises_is_reported_failed_with_why(node: Any) -> None:
    sock = node.config.socket
    _call(sock, Op.REGISTER, job="c8")
    g = gate.connect(sock, "c8")

    def job() -> None:
        with g.phase("rollout", version=0):
            raise RuntimeError("CUDA out of memory\nmore lines")
    thread, out = _in_thread(job)
    wait_for(lambda: _waiting(sock, "c8"), 10, "the process waits")
    _call(sock, Op.ACTIVATE, job="c8", phase="rollout", external=True, version=0, step=0)
    thread.join(10)
    assert isinstance(out.get("error"), RuntimeError)     # raised on in the job
    worker = _call(sock, Op.PHASE, job="c8")["worker"]
    assert (worker["state"], worker["error"]) == ("failed", "RuntimeError: CUDA out of memory")
