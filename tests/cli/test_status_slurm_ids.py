"""``weave status -o %A``: the Slurm job ids of a job's allocations."""

from __future__ import annotations

from weave_slurm.cli.status import format_rows


def test_the_slurm_jobids_column() -> None:
    rows = [{"job": 3, "slurm_job_ids": ["41", "42"]}, {"job": 4, "slurm_job_ids": []},
            {"job": 5}]
    assert format_rows(rows, "%.5i %A") == ["JOBID SLURM_JOBIDS", "    3 41,42", "    4 -",
                                            "    5 -"]


def test_the_long_preset_has_it_and_the_default_does_not() -> None:
    row = {"job": 3, "user": "alice", "uid": 1000, "name": "a", "group": 1,
           "phase": "train", "iter": "1/2", "slowdown": None, "slo": 1.5,
           "state": "RUNNING", "time_s": 5.0, "nodes": ["h20-0", "h800-0"], "reason": "",
           "slurm_job_ids": ["41", "42"]}
    long = format_rows([row], "long")
    assert "SLURM_JOBIDS" in long[0].split() and "41,42" in long[1].split()
    assert "SLURM_JOBIDS" not in format_rows([row], "default")[0]
