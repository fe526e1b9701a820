from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
JOBS = sorted(str(p) for p in (ROOT / "configs" / "jobs").glob("*.toml"))
SITE = str(ROOT / "configs" / "site.example.toml")


def weave(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weave_slurm.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)


@pytest.mark.parametrize("policy", ["weave", "isolated"])
def test_plan_json_matches_golden(policy: str, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    rel_jobs = [os.path.relpath(p, ROOT) for p in JOBS]
    code = run_app(app, "weave", ["plan", "--site", os.path.relpath(SITE, ROOT), "--policy",
                                  policy, "--out", str(out), *rel_jobs])
    assert code == 0
    got = json.loads(out.read_text())
    golden = GOLDEN / f"plan_{policy}.json"
    if os.environ.get("WEAVE_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(golden.read_text())


def test_plan_weave_beats_isolated_per_job_hour() -> None:
    proc = weave("plan", "--site", SITE, "--json", *JOBS)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert all(j["within_slo"] for j in s["jobs"])
    assert s["cost_ratio"]["vs_isolated"] > 1.0
    assert s["pools"]["rollout"]["gpus"] < s["baselines"]["isolated"]["pools"]["rollout"]["gpus"]


def test_plan_pools_rollout_gpus_of_weaves_groups_only(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert run_app(app, "weave", ["plan", "--site", SITE, "--rollout", "pooled", "--out",
                                  str(out), *JOBS]) == 0
    s = json.loads(out.read_text())
    assert all(j["within_slo"] for j in s["jobs"])
    assert s["groups"] and all(g["pool_gpus"] > 0 for g in s["groups"])
    for g in s["groups"]:   # a pool's GPUs are the share of nodes it holds and pays
        assert g["rollout_nodes"] == pytest.approx(g["pool_gpus"] / 8)
    gpus = sum(g["pool_gpus"] for g in s["groups"])
    assert s["pools"]["rollout"]["gpus"] == gpus
    # the baselines keep their whole nodes: the same as in a plan of pinned groups
    pinned = weave("plan", "--site", SITE, "--json", *JOBS)
    assert s["baselines"] == json.loads(pinned.stdout)["baselines"]


def test_plan_table_output() -> None:
    """Piped, every table is whole (not cut to 80 columns); the pools are named by the
    site's partitions, and RATIO compares cost per job-hour."""
    proc = weave("plan", *JOBS)
    assert proc.returncode == 0, proc.stderr
    assert "Cost against the baselines" in proc.stdout and "colocated" in proc.stdout
    assert "RATIO (per job-hour)" in proc.stdout and "…" not in proc.stdout
    assert "BUBBLE h20" in proc.stdout and "h800 GPUs" in proc.stdout
    s = json.loads(weave("plan", "--json", *JOBS).stdout)
    row = next(line for line in proc.stdout.splitlines() if " isolated " in line)
    assert f"{s['cost_per_job_hour_ratio']['vs_isolated']:.2f}x" in row


@pytest.mark.parametrize(("args", "needle"), [
    (["plan", "missing.toml"], "missing.toml: file not found"),
    (["plan", "--policy", "fastest", JOBS[0]], "--policy 'fastest': valid choices"),
    (["plan", "--rollout", "shared", JOBS[0]], "--rollout 'shared': valid choices: pinned, "
                                               "pooled"),
    (["config", "check", "nope.toml"], "nope.toml: file not found"),
    (["plan", JOBS[0], JOBS[0]], "job names must be unique"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    proc = weave(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_spec_field_names_file_key_and_value(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(Path(JOBS[0]).read_text().replace("slo = ", "slo = 0.5 #"))
    proc = weave("plan", str(bad))
    assert proc.returncode == 2
    assert f"{bad}: key 'slo' = 0.5: must be >= 1" in proc.stderr


def test_config_check_ok() -> None:
    proc = weave("config", "check", SITE, *JOBS)
    assert proc.returncode == 0 and proc.stdout.count(": ok") == len(JOBS) + 1
    # each job's layout on the site (configs/jobs/qwen32b-grpo-16k.toml: 16 rollout
    # GPUs in engines of 2 on 8-GPU nodes, 8 training ranks on one node)
    line = next(ln for ln in proc.stdout.splitlines() if "qwen32b-grpo-16k.toml" in ln)
    assert line.endswith("; train 1x8 ranks; rollout 2x4 engines x 2 GPUs; planning-only: "
                         "no entry)"), line


def test_config_check_with_the_site_forgotten_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(ROOT / "configs" / "jobs" / "qwen7b-grpo-8k.toml")
    assert run_app(app, "weave", ["config", "check", job]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"weave: error: {job}: is a job spec, not a site config; usage: weave "
                   "config check SITE.toml [JOB.toml ...]")
