"""``weave node serve`` path expansion (one argv for every node of a step, no shell), and
``weave node hold`` (the allocation script's body)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from weave_slurm.cli.node import _per_node
from weave_slurm.errors import ConfigError


def test_node_placeholder_comes_from_slurmd_nodename(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "h20-3")
    assert _per_node(Path("/dev/shm/weave/{node}")) == Path("/dev/shm/weave/h20-3")
    assert _per_node(Path("/plain")) == Path("/plain")


@pytest.mark.parametrize("bad", ["..", "a/b"])
def test_a_node_name_that_is_not_a_plain_name_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                          bad: str) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", bad)
    with pytest.raises(ConfigError, match=r"cannot expand \{node\}"):
        _per_node(Path("/dev/shm/weave/{node}"))


def _hold(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weave_slurm.cli.node", "hold",
                           "--allocation-watch-s", "0.1"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def test_hold_ends_once_slurm_says_its_job_no_longer_runs(tmp_path: Path) -> None:
    """The allocation script's body: it holds while squeue lists its job RUNNING, and
    ends by itself (exit 0) at the first definite answer that the job is over."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "asked"
    (bin_dir / "squeue").write_text(   # RUNNING twice, then NODE_FAIL
        f'#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}\n'
        'if [ $n -le 2 ]; then echo RUNNING; else echo NODE_FAIL; fi\n')
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    res = _hold(tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert int(count.read_text()) == 3
    assert "allocation hold exits: its allocation no longer runs (job 42 is NODE_FAIL)" \
        in res.stderr


def test_hold_outside_an_allocation_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    res = _hold(tmp_path, env)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "weave node: error: node hold: SLURM_JOB_ID is not set; it runs as the body of an "
        "allocation's batch script"]
