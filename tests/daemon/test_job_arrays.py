"""Job arrays in weaved (daemon/job_arrays.py), submitted with weave-sbatch --array to an
in-process weaved: one job per element, shown as ID_TASK as squeue shows them, at most
%n of them placed at once (the others' REASON says so, as squeue's JobArrayTaskLimit),
weave cancel of the array's id cancels every element, ID_TASK only that one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op


def _rows(sock: Path, job: int) -> dict[str, dict]:
    return {r["id"]: r for r in call(sock, Op.STATUS, jobs=[job], all=True)["jobs"]}


def test_array_elements_limit_and_cancel(weaved: Running, tmp_path: Path,  # noqa: F811
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sock = weaved.socket
    s = ["--socket", str(sock)]
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("arr"))
    assert run_app(sbatch_app, "weave-sbatch", [str(spec), "--parsable", "--array=0-6:2%1",
                                                *s]) == 0
    first = int(capsys.readouterr().out.strip())
    names = [f"{first}_{t}" for t in (0, 2, 4, 6)]
    wait_for(lambda: sum(r["state"] == "RUNNING" for r in _rows(sock, first).values()) == 1,
             20, "one element placed")
    rows = _rows(sock, first)
    assert sorted(rows) == sorted(names)
    assert rows[names[0]]["job"] == first            # the array's id: its first element's
    held = [r for r in rows.values() if r["state"] == "PENDING"]
    assert len(held) == 3 and all(r["reason"] == (
        f"held: 1 of array {first}'s elements run, its limit is 1 (--array ...%1; as "
        "squeue's JobArrayTaskLimit)") for r in held), held
    assert run_app(app, "weave", ["status", "-j", str(first), "-o", "%i %T", *s]) == 0
    shown = capsys.readouterr().out.split()
    assert all(n in shown for n in names)

    running = next(n for n, r in rows.items() if r["state"] == "RUNNING")
    assert run_app(app, "weave", ["cancel", running, *s]) == 0     # ID_TASK: that one
    wait_for(lambda: sum(r["state"] == "RUNNING" for r in _rows(sock, first).values()) == 1
             and _rows(sock, first)[running]["state"] == "CANCELLED", 20, "the next placed")
    assert run_app(app, "weave", ["cancel", str(first), *s]) == 0   # the array: all
    wait_for(lambda: all(r["state"] == "CANCELLED" for r in _rows(sock, first).values()),
             20, "every element cancelled")
    assert run_app(app, "weave", ["cancel", f"{first}_5", *s]) == 2
    assert f"no array element {first}_5" in capsys.readouterr().err
