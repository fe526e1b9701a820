"""Directives on the session's Slurm cluster: a script's ``#SBATCH -A physics`` and
``#SBATCH -t 45`` reach the group's allocations as Slurm shows them (``squeue -o %a``,
``%l``), with a site that names no account of its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness.waits import wait_for
from tests.harness.weaved import call, idle_on_slurm, serving_on_slurm
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec
from weave_slurm.slurm.command_runner import run_command

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SITE = "[pools.rollout]\n[pools.train]\n"   # no [slurm]: the job's account is the only one
SCRIPT = """\
#!/bin/bash
#SBATCH -A physics
#SBATCH -t 45 --job-name=phys-rl
#WEAVE --model-params-b=0.5 --rollout-gpus=1 --train-gpus=1 --max-tokens=64
#WEAVE --entry=builtin:grpo-toy
#WEAVE --rollout-s=10 --train-s=10 --rollout-state-gib=1 --train-state-gib=1
python train.py
"""


def test_an_sbatch_account_shows_on_the_groups_allocations(slurm_cluster: Any,
                                                            public_dir: Path) -> None:
    env = dict(slurm_cluster.env)
    instance = f"dir{os.getpid()}"
    (public_dir / "site.toml").write_text(SITE)
    script = public_dir / "phys.sh"
    script.write_text(SCRIPT)
    spec_text, spec = build_spec(script, {})
    assert spec.slurm.account == "physics" and spec.name == "phys-rl"
    cfg = idle_on_slurm(public_dir / "state", instance, env, public_dir / "site.toml")
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        job = call(sock, Op.SUBMIT, spec=spec_text, source=str(script))["job"]
        row = wait_for(lambda: call(sock, Op.STATUS, jobs=[job])["jobs"][0], 90,
                       f"job {job} running", until=lambda r: r["state"] == "RUNNING")
        assert row["name"] == "phys-rl"
        ids = call(sock, Op.SHOW, kind="job", id=job)["slurm_job_ids"]
        assert len(ids) == 2, ids   # one h20 and one h800 allocation
        out = run_command(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%a|%l"],
                          env={**os.environ, **env}, timeout_s=30).stdout
        shown = {line.split("|")[0]: line.split("|")[1:] for line in out.split()}
        assert shown == {i: ["physics", "45:00"] for i in ids}, out
        call(sock, Op.CANCEL, jobs=[job])
        wait_for(lambda: not w.backend.list_allocations(f"weave-g{instance}."), 60,
                 "allocations released")
