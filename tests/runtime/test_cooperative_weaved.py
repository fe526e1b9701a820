"""Cooperative jobs through weaved on the LocalBackend, with real node daemons: each
job's own two processes (tests/runtime/coop_job.py, torch-free) take their phases
through ``weave_slurm.gate``; weaved packs them into one group and its runtime grants
their phases in its cyclic order.

- two jobs complete; on each node one phase at a time, the two jobs' phases
  interleave, each job's phases alternate rollout v -> train v -> rollout v + 1, and
  every phase body the job printed lies inside the runtime's span of that phase (a
  phase runs from the grant until the process leaves its ``with`` block);
- one job's train at a version without its rollout is refused, and the job's own
  output and its REASON hold the reason (it then goes on and completes);
- the reward a job reports in its rollout turn is its iterations' reward;
- a job that holds a phase past its deadline is reported hung and FAILED, its
  processes stopped, while the others complete; so is one whose process dies;
- ``weave status`` shows ITER from the gate's reports; the output files hold the
  jobs' prints (stdout and stderr apart, ``%j`` expanded).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import wait_for
from tests.harness.weaved import call, release_all, rl_config, serve, serving, wait_states
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.group_runtime import GroupRuntime
from weave_slurm.daemon.protocol import Op
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase

JOB = Path(__file__).with_name("coop_job.py")
STEPS = 3
SITE = """
[pools.rollout]
[pools.train]
[runtime]
phase_deadline_floor_s = 6.0
"""


def coop_spec(name: str, work: Path, mode: str) -> str:
    line = f"{sys.executable} {JOB}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COOP_MODE": mode,
           "COOP_STEPS": str(STEPS)}
    launch = "\n".join([
        "", "[slurm]", 'output = "out-%j.txt"', 'error = "err-%x-%j.txt"',
        "", "[launch]", f"rollout = {json.dumps(line)}", f"train = {json.dumps(line)}",
        "", "[launch.env]",
        *(f"{k} = {json.dumps(v)}" for k, v in env.items()), ""])
    return job_spec_toml(name, iterations=STEPS, rollout_s=0.5, train_s=0.5,
                         workdir=str(work)) + launch


def bodies(text: str) -> dict[tuple[str, int], tuple[float, float]]:
    """``(phase, version) -> (start, end)`` of the job's own printed phase bodies."""
    out = {}
    for line in text.splitlines():
        if line.startswith("body "):
            _, role, v, t0, t1 = line.split()
            out[(role, int(v[1:]))] = (float(t0), float(t1))
    return out


def check_barrier_and_grants(spans: list[Span], job: str, text: str) -> None:
    mine = sorted((s for s in spans if s.job_id == job and s.ok), key=lambda s: s.start_s)
    kinds = [s.kind for s in mine]
    assert kinds == [Phase.ROLLOUT, Phase.TRAIN] * STEPS, (job, kinds)
    for a, b in itertools.pairwise(mine):   # rollout v -> train v -> rollout v+1
        assert a.end_s <= b.start_s, (job, a, b)
    # the job's own body of each phase: after its previous phase ended (the grant comes
    # after that), and over before the runtime saw the phase end (it runs until the
    # process leaves its with block)
    printed = bodies(text)
    prev_end = float("-inf")
    for i, span in enumerate(mine):
        t0, t1 = printed[(span.kind.value, i // 2)]
        assert span.ready_s is not None and max(prev_end, span.ready_s) <= t0, \
            (job, span, t0, prev_end)
        assert t0 < t1 <= span.end_s, (job, span, t0, t1)
        prev_end = span.end_s


def check_interleaved(spans: list[Span], jobs: set[str]) -> None:
    for node in {s.node for s in spans}:
        on = sorted((s for s in spans if s.node == node and s.ok), key=lambda s: s.start_s)
        for a, b in itertools.pairwise(on):
            assert a.end_s <= b.start_s, f"two phases at once on {node}: {a} {b}"
    rollouts = [s.job_id for s in sorted(spans, key=lambda s: s.start_s)
                if s.kind is Phase.ROLLOUT and s.ok and s.job_id in jobs]
    switches = sum(1 for a, b in itertools.pairwise(rollouts) if a != b)
    assert switches >= 2, f"the jobs' rollouts did not interleave: {rollouts}"


def test_cooperative_jobs_share_a_group_through_the_gate(
        capsys: pytest.CaptureFixture[str]) -> None:
    with public_dir("weave-coop-") as root, shm_dir("weave-coop-") as shm:
        (root / "site.toml").write_text(SITE)
        cfg = rl_config(root, shm, path_roots=(root,), site_path=root / "site.toml")
        with serving(cfg) as w:
            sock = w.config.socket
            modes = {"coop-a": "ok", "coop-b": "wrong-version", "coop-c": "hang",
                     "coop-d": "crash"}
            works = {name: root / name for name in modes}
            for work in works.values():
                work.mkdir(mode=0o755)
            ids = {name: call(sock, Op.SUBMIT, spec=coop_spec(name, works[name], mode),
                              source=f"{name}.toml")["job"] for name, mode in modes.items()}
            seen: list[dict[str, Any]] = []
            rows = {r["job"]: r for r in wait_states(sock, list(ids.values()),
                                                     {"COMPLETED", "FAILED"}, 240, seen)}
            a, b, c, d = (ids[n] for n in ("coop-a", "coop-b", "coop-c", "coop-d"))
            assert len({rows[j]["group"] for j in ids.values()}) == 1, rows   # one group
            for job in (a, b):
                assert rows[job]["state"] == "COMPLETED", rows[job]
                assert rows[job]["iter"] == f"{STEPS}/{STEPS}", rows[job]
            # ITER from the gate's reports while it ran
            iters = {r["iter"] for r in seen if r["job"] == a and r["state"] == "RUNNING"}
            assert iters & {"1/3", "2/3"}, iters
            capsys.readouterr()
            assert run_app(weave_app, "weave", ["status", "--socket", str(sock), "-t", "all",
                                                "-o", "%i %I %T"]) == 0
            shown = capsys.readouterr().out.splitlines()
            assert f"{a} {STEPS}/{STEPS} COMPLETED" in shown, shown

            assert isinstance(w.driver, GroupRuntime)
            spans = w.driver.spans[rows[a]["group"]]
            out = {name: (works[name] / f"out-{ids[name]}.txt").read_text() for name in modes}
            for name in ("coop-a", "coop-b"):
                check_barrier_and_grants(spans, str(ids[name]), out[name])
            check_interleaved(spans, {str(a), str(b)})

            # the refused train: typed error in the job's process, the reason in one line
            refused = [ln for ln in out["coop-b"].splitlines() if ln.startswith("refused: ")]
            assert refused == ["refused: train at version 1 refused: no rollout at version "
                               "1 ended (on-policy: a train consumes the rollout of its own "
                               "version); the job is at version 0, its next train is at "
                               "version 0"], out["coop-b"]
            assert "the barrier is broken" not in out["coop-b"]
            reasons = {r["reason"] for r in seen if r["job"] == b and r["state"] == "RUNNING"}
            assert refused[0].removeprefix("refused: ") in reasons, reasons
            # weaved starts the node daemons itself: no advice to start them by hand
            assert not [r for r in seen if "weave node serve" in (r["reason"] or "")]
            # the reward each rollout turn reported (its train turn reports a loss only)
            live = w.driver.live(a)
            assert live is not None and live["rewards"] == pytest.approx([0.1, 0.2, 0.3])

            # the hung job: FAILED as hung, its processes stopped, the others unharmed
            assert rows[c]["state"] == "FAILED", rows[c]
            assert "train on" in rows[c]["reason"] and "hung: ran past its deadline" \
                in rows[c]["reason"], rows[c]
            assert "train v1 hangs" in out["coop-c"] and "train done" not in out["coop-c"]
            assert (works["coop-c"] / "weights.json").read_text() == '{"version": 2}'
            # a process that dies: FAILED, its other process stopped
            assert rows[d]["state"] == "FAILED", rows[d]
            assert "exited with code 3 during rollout" in rows[d]["reason"], rows[d]
            assert "rollout v1 crashes" in out["coop-d"] and "done" not in out["coop-d"]

            # output files: stdout and stderr apart, as sbatch's --output/--error
            for name in ("coop-a", "coop-b"):
                text = out[name]
                assert "rollout done" in text and "train done" in text, text
                assert "switch-in train v2" in text and "switch-out rollout v0" in text
                err = (works[name] / f"err-{name}-{ids[name]}.txt").read_text()
                assert sorted(err.split("\n"))[-2:] == ["rollout stderr line",
                                                        "train stderr line"], err
            wait_for(lambda: not _alive(JOB), 30, "no job process left")


def _alive(script: Path) -> list[int]:
    """Pids of processes still running ``script``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(script).encode() in cmd and b"reaper.py" not in cmd:   # not its launcher
                pids.append(int(proc.name))
    return pids


def test_a_weaved_restart_starts_a_cooperative_jobs_processes_again() -> None:
    """weaved holds no state of a cooperative job: a restarted weaved stops the processes
    the old one started (they were waiting at the gate) and starts them again from
    version 0; the job then completes."""
    with public_dir("weave-coop-rs-") as root, shm_dir("weave-coop-rs-") as shm:
        (root / "site.toml").write_text(SITE)
        cfg = rl_config(root, shm, path_roots=(root,), site_path=root / "site.toml")
        work = root / "coop-rs"
        work.mkdir(mode=0o755)
        served = serve(cfg)
        try:
            job = call(cfg.socket, Op.SUBMIT, spec=coop_spec("coop-rs", work, "ok"),
                       source="coop-rs.toml")["job"]
            wait_for(lambda: served.weaved.driver.live(job), 60, f"job {job} at version 1",
                     interval_s=0.1, until=lambda live: live is not None
                     and (live["version"] or 0) >= 1)
            first = _alive(JOB)
            assert len(first) == 2, first      # its rollout and train processes
            served.stop()
            served = serve(cfg)   # a fresh weaved on the same state dir
            rows = wait_states(cfg.socket, [job], {"COMPLETED", "FAILED"}, 120, [])
            assert rows[0]["state"] == "COMPLETED", rows
            assert rows[0]["iter"] == f"{STEPS}/{STEPS}"
            assert not set(first) & set(_alive(JOB))   # the old ones were stopped
            text = (work / f"out-{job}.txt").read_text()
            starts = [ln for ln in text.splitlines() if " starts in " in ln]
            assert len(starts) == 4, text      # each role twice: started again
            assert text.count("body train v0 ") == 2 and text.count("train done") == 1
        finally:
            served.stop()
            release_all(served.weaved.backend)
