"""The shipped TRL example (configs/jobs/trl/trl-grpo-tiny.toml, ``builtin:trl-grpo-tiny``)
submitted with weave-sbatch on the session's Slurm cluster (separate hosts), its
``--output`` on the shared file system: it ends COMPLETED, ``weave status`` showed its
ITER progress while it ran, and the output file holds TRL's own per-step log lines
(printed by its resident workers on the group's h20 and h800 hosts) between weaved's
event lines."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_on_slurm, serving_on_slurm
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.daemon.protocol import Op

pytest.importorskip("trl")
pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SPEC = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "trl" / "trl-grpo-tiny.toml"
STEPS = 8   # enough steps that a status poll sees the job between its first and last


def test_weave_sbatch_of_the_trl_example_writes_trls_lines_to_its_output(
        slurm_cluster: SessionCluster, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # the node daemons' steps inherit it
    env = dict(slurm_cluster.env)
    instance = f"trlo{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    logs = shared_tmp / "logs"
    logs.mkdir(mode=0o755)
    cfg = rl_on_slurm(dirs, instance, env, shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        assert run_app(sbatch_app, "weave-sbatch", [
            str(SPEC), "--iterations", str(STEPS), "--output", f"{logs}/%x-%j.out",
            "--parsable", "--socket", str(sock)]) == 0
        job = int(capsys.readouterr().out.strip())
        seen: list[dict[str, Any]] = []
        shown: list[str] = []

        def status() -> list[dict[str, Any]]:
            assert run_app(weave_app, "weave", ["status", "--socket", str(sock), "-t", "all",
                                                "-o", "%i %I %T"]) == 0
            shown.extend(capsys.readouterr().out.splitlines())
            got = list(call(sock, Op.STATUS, jobs=[job])["jobs"])
            seen.extend(got)
            return got

        rows = wait_for(status, 150, f"job {job} ended", interval_s=0.2,
                        until=lambda got: got[0]["state"] in ("COMPLETED", "FAILED"))
        assert rows[0]["state"] == "COMPLETED", (rows, seen[-3:])
        running = {line for line in shown if line.endswith(" RUNNING")}
        assert running & {f"{job} {i}/{STEPS} RUNNING" for i in range(1, STEPS)}, shown
        path = logs / f"trl-grpo-tiny-{job}.out"
        text = wait_for(path.read_text, 10, "weaved's COMPLETED line",
                        until=lambda t: ": COMPLETED" in t)
        steps = [ast.literal_eval(line) for line in text.splitlines()
                 if line.startswith("{'") and "'loss'" in line]
        assert len(steps) == STEPS, text           # TRL's own line, one per step
        assert all({"loss", "reward", "grad_norm", "learning_rate"} <= set(s) for s in steps)
        assert f" weave job {job} (trl-grpo-tiny): RUNNING" in text, text
        with capsys.disabled():
            print(f"\n{path.name}: {len(text.splitlines())} lines, {len(steps)} of TRL's")
