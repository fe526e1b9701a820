"""README's first command: ``weave demo`` end to end (short), as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch


def test_weave_demo_runs_three_jobs_as_one_group_and_writes_its_summary(
        tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "weave_slurm.cli", "demo", "--steps", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["groups"] == [1]   # one co-execution group
    assert sorted(summary["rewards"]) == ["grpo-a", "grpo-b", "grpo-c"]
    assert all(len(r) == 2 for r in summary["rewards"].values())
    for run in ("grouped", "isolated"):
        assert 0 < summary[run]["rollout_busy"] <= 1 and 0 < summary[run]["train_busy"] <= 1
    assert (out / "gantt.png").stat().st_size > 0 and (out / "rewards.png").stat().st_size > 0
    assert "Gantt chart:" in proc.stdout and (out / "busy.png").stat().st_size > 0
    # no terminal here: plain progress lines as things happen, not a live table's last frame
    assert "] grouped: 3 jobs x 2 steps submitted to weaved" in proc.stdout
    assert "] job 1 grpo-a: COMPLETED ITER 2/2 group 1" in proc.stdout
    assert summary["options"] == {"prompt_len": 2}
    assert all(s["init"] == (s["phase"] == "train" and s is firsts[s["job"]])
               for firsts in [_first_train(summary["spans"])] for s in summary["spans"]
               if s["phase"] == "train")
    # weave sacct's records of the six jobs: every member charged from its placement (or
    # its nodes' grant) to its end; a job alone pays every second of its nodes, the three
    # grouped ones split the group's seconds between them. (Whether grouping is cheaper in
    # total depends on the steps: two steps on two cores are mostly model builds and
    # process starts, and a loaded machine makes three at once slower than one by one.)
    usage = {r["name"]: r for r in summary["usage"]}
    assert sorted(usage) == sorted([*summary["rewards"], *(f"{n}-alone"
                                                           for n in summary["rewards"])])
    for r in usage.values():
        assert r["gpu_s"]["rollout"] > 0 and r["gpu_s"]["train"] > 0 and r["cost"] > 0, r
    grouped = [usage[n] for n in summary["rewards"]]
    for r in usage.values():
        elapsed = r["ended_s"] - r["started_s"]
        share = r["node_s"]["rollout"] / elapsed
        assert (share < 0.75) if r in grouped else (0.8 < share < 1 + 1e-6), r
    span = max(r["ended_s"] for r in grouped) - min(r["started_s"] for r in grouped)
    assert 0.8 * span < sum(r["node_s"]["rollout"] for r in grouped) < span + 1e-6
    assert "RolloutGPUHours" in proc.stdout


def _first_train(spans: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    """Each job's first train span (its model build, ``init``)."""
    out: dict[object, dict[str, object]] = {}
    for s in sorted(spans, key=lambda s: float(str(s["start_s"]))):
        if s["phase"] == "train":
            out.setdefault(s["job"], s)
    return out
