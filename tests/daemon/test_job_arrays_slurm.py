"""sbatch habits on the session's Slurm cluster (separate hosts), as a Slurm user
reaches for them: ``weave-sbatch --array=0-1%1`` of a cooperative script runs one
element at a time (the other's REASON says so, as squeue's JobArrayTaskLimit), each
element's processes, on their own hosts, find ``SLURM_ARRAY_*`` and
``CUDA_VISIBLE_DEVICES`` (the member's GPUs on that node) in their environment, and
print to the default ``weave-%j.out`` in the job's ``-D`` on the shared file system;
a hosted job submitted without ``-o`` gets weaved's lines in its default
``weave-%j.out`` too, which ``weave show job`` and ``weave logs`` name."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_on_slurm, serving_on_slurm, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

JOB = Path(__file__).parents[1] / "runtime" / "coop_job.py"
SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=sweep --array=0-1%1 --chdir={work}
#WEAVE --model-params-b=0.5 --rollout-gpus=2 --train-gpus=2 --max-tokens=64
#WEAVE --rollout-s=1 --train-s=1 --rollout-state-gib=1 --train-state-gib=1
#WEAVE --iterations=1 --cooperative
echo "env $WEAVE_ROLE task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID" \\
     "count=$SLURM_ARRAY_TASK_COUNT max=$SLURM_ARRAY_TASK_MAX cvd=$CUDA_VISIBLE_DEVICES"
exec {python} {job}
"""


def test_array_default_output_and_environment(slurm_cluster: SessionCluster,
                                              shared_tmp: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(slurm_cluster.env)
    instance = f"arr{os.getpid()}"
    work = shared_tmp / "work"
    work.mkdir(mode=0o755)
    script = shared_tmp / "sweep.sh"
    script.write_text(SCRIPT.format(work=work, python=sys.executable, job=JOB))
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COOP_STEPS": "1",
               "COOP_BODY_S": "0.3"}
    array_text = build_spec(script, {}, environ)[0]
    hosted = shared_tmp / "hosted.toml"
    hosted.write_text(job_spec("plain", 3, 1))
    hosted_text = build_spec(hosted, {"workdir": str(work)})[0]
    cfg = rl_on_slurm(weaved_dirs(slurm_cluster.cluster, instance), instance, env,
                      shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        got = call(sock, Op.SUBMIT, spec=array_text, source=str(script))
        first, ids = got["job"], got["jobs"]
        assert ids == [first, first + 1] and got["warnings"] == []
        plain = call(sock, Op.SUBMIT, spec=hosted_text, source=str(hosted))["job"]
        held = wait_for(lambda: call(sock, Op.STATUS, jobs=[ids[1]])["jobs"][0], 60,
                        "the second element held by %1",
                        until=lambda r: "JobArrayTaskLimit" in (r["reason"] or ""))
        assert held["id"] == f"{first}_1" and held["state"] == "PENDING", held
        seen: list[dict[str, Any]] = []
        rows = wait_states(sock, [*ids, plain], {"COMPLETED", "FAILED", "CANCELLED"}, 420,
                           seen)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
        polls = [seen[i:i + 3] for i in range(0, len(seen), 3)]   # 3 rows a poll
        assert not [p for p in polls if sum(r["job"] in ids and r["state"] in
                                            ("PLACED", "RUNNING") for r in p) > 1], polls
        for task, job in enumerate(ids):
            text = (work / f"weave-{job}.out").read_text()      # the default, in -D
            for role in ("rollout", "train"):
                assert (f"env {role} task={task} of {first} count=2 max=1 cvd=0,1"
                        in text), text
                assert f"{role} done" in text, text
        shown = call(sock, Op.SHOW, kind="job", id=plain)
        out = work / f"weave-{plain}.out"
        assert shown["stdout"] == shown["stderr"] == str(out)

        def logged() -> str:   # weaved writes how it ended on its next tick after it ended
            assert run_app(app, "weave", ["logs", str(plain), "--socket", str(sock)]) == 0
            return capsys.readouterr().out
        text = wait_for(logged, 15, "weave logs to say COMPLETED", interval_s=0.3,
                        until=lambda out: "COMPLETED" in out)
        assert f"weave job {plain} (plain): RUNNING" in text
