"""Accounting on the session's Slurm cluster: a site whose ``[slurm]`` table names an
account, a QOS and a time limit; weaved's allocations carry them as Slurm shows them
(``squeue -o %a %q %l``), ``weave show job`` names those Slurm jobs, and ``weave sacct``
charges the job its share.

This cluster has no slurmdbd (``AccountingStorageType=accounting_storage/none``): Slurm
22.05 then records ``--account`` and ``--time`` but accepts ``--qos`` and drops it (QOS
shows ``(null)``), which the test checks as such; with accounting storage the QOS must
show as asked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness.waits import wait_for
from tests.harness.weaved import call, idle_on_slurm, serving_on_slurm
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.slurm.command_runner import run_command

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SITE = """
[pools.rollout]
[pools.train]
[slurm]
account = "rl-lab"
qos = "normal"
time_limit_min = 90
"""


def _squeue(env: dict[str, str], ids: list[str]) -> dict[str, list[str]]:
    out = run_command(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%a|%q|%l"],
                      env={**os.environ, **env}, timeout_s=30).stdout
    return {line.split("|")[0]: line.split("|")[1:] for line in out.split()}


def _accounting_storage(env: dict[str, str]) -> str:
    out = run_command(["scontrol", "show", "config"], env={**os.environ, **env},
                      timeout_s=30).stdout
    return next(line.split("=", 1)[1].strip() for line in out.splitlines()
                if line.startswith("AccountingStorageType"))


def test_allocations_are_charged_to_the_sites_account(
        slurm_cluster: Any, public_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(slurm_cluster.env)
    instance = f"acct{os.getpid()}"
    (public_dir / "site.toml").write_text(SITE)
    cfg = idle_on_slurm(public_dir / "state", instance, env, public_dir / "site.toml")
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        job = call(sock, Op.SUBMIT, spec=job_spec_toml("acct"), source="acct.toml")["job"]
        wait_for(lambda: call(sock, Op.STATUS, jobs=[job])["jobs"][0]["state"], 90,
                 f"job {job} running", until=lambda st: st == "RUNNING")
        shown = call(sock, Op.SHOW, kind="job", id=job)
        ids = shown["slurm_job_ids"]
        assert len(ids) == 2, shown   # one h20 and one h800 allocation
        qos = "(null)" if _accounting_storage(env) == "accounting_storage/none" else "normal"
        assert _squeue(env, ids) == {i: ["rl-lab", qos, "1:30:00"] for i in ids}
        capsys.readouterr()
        assert run_app(app, "weave", ["show", "job", str(job), "--socket", str(sock)]) == 0
        assert f"SlurmJobIds={','.join(ids)}" in capsys.readouterr().out.splitlines()
        call(sock, Op.CANCEL, jobs=[job])
        wait_for(lambda: not w.backend.list_allocations(f"weave-g{instance}."), 60,
                 "allocations released")
        wait_for(lambda: w.store.usage_marks().get(1), 30, "group booked to its end",
                 until=lambda mark: mark is not None and mark.closed)
        assert run_app(app, "weave", ["sacct", "-j", str(job), "--json",
                                      "--socket", str(sock)]) == 0
        (rec,) = json.loads(capsys.readouterr().out)["jobs"]
    assert rec["account"] == "rl-lab" and rec["qos"] == "normal"   # as asked, per row
    assert rec["slurm_job_ids"] == ids and rec["gpu_s"]["rollout"] > 0 \
        and rec["gpu_s"]["train"] > 0 and rec["cost"] > 0, rec
