"""sbatch's --array as weave reads it (config/job_array.py): ranges, steps, lists and
the %n limit; a bad value is one line naming --array, exit 2, as weave-sbatch's other
flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.job_array import JobArray, parse_array
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.sbatch import NO_SLURM
from weave_slurm.daemon.job_arrays import elements
from weave_slurm.daemon.submission import build_spec
from weave_slurm.errors import ConfigError


@pytest.mark.parametrize(("text", "tasks", "limit", "step"), [
    ("0-3", (0, 1, 2, 3), None, 1),
    ("1-7:2%2", (1, 3, 5, 7), 2, 2),
    ("1,3,5-7", (1, 3, 5, 6, 7), None, 1),
    ("4", (4,), None, 1),
    ("0-1000%50", tuple(range(1001)), 50, 1),
    ("3,1,1", (1, 3), None, 2),
])
def test_ranges_steps_lists_and_limit(text: str, tasks: tuple[int, ...], limit: int | None,
                                      step: int) -> None:
    array = parse_array(text)
    assert (array.tasks, array.limit, array.step) == (tasks, limit, step)


@pytest.mark.parametrize(("text", "says"), [
    ("", "'' of '' is not a task range"),
    ("5-2", "a range goes up"),
    ("0-1001", "task index 1001 is over 1000"),
    ("0-3%0", "the limit after '%' must be a whole number >= 1"),
    ("0-3%x", "the limit after '%' must be"),
    ("1:2", "'1:2' of '1:2' is not a task range"),
    ("a-b", "is not a task range"),
    ("0-4:0", "a range goes up"),
    ("-1", "is not a task range"),
])
def test_bad_values_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="valid: a-b") as err:
        parse_array(text)
    assert says in str(err.value)


def test_the_environment_of_an_element_is_sbatchs() -> None:
    assert JobArray((1, 3, 5, 7), 2).env(40, 5) == {
        "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_ARRAY_TASK_MAX": "7", "SLURM_ARRAY_TASK_STEP": "2"}
    assert NO_SLURM.array_env() == {}
    element = dataclasses.replace(NO_SLURM, array="0-1", array_job=9, array_task=1)
    assert element.array_env()["SLURM_ARRAY_TASK_ID"] == "1"


def test_each_element_gets_its_task_and_the_seed_plus_its_task(tmp_path: Path) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("arr"))
    _, job = build_spec(spec, {"array": "2-6:2%1", "seed": 100})
    assert job.slurm.array == "2-6:2%1"
    specs = elements(job)(31)
    assert [(s.slurm.array_job, s.slurm.array_task, s.seed) for s in specs] == [
        (31, 2, 102), (31, 4, 104), (31, 6, 106)]


@pytest.mark.parametrize("flag", [["--array=7-3"], ["-a", "1-2%0"]])
def test_weave_sbatch_refuses_a_bad_array_in_one_line(
        tmp_path: Path, flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("arr"))
    assert run_app(sbatch_app, "weave-sbatch", [str(spec), "--test-only", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--array=" in err[0] and "valid: a-b[:s][%n]" in err[0], err
