"""``weave status -o %A``: the Slurm job ids of a job's allocations."""

from __future__ import annotations

from weave_slurm.cli.status import format_rows


def test_the_slurm_jobids_column() -> None:
    rows = [{"job": 3, "slurm_job_ids": ["41", "42"]}, {"job": 4, "slurm_job_ids": []},
            {"job": 5}]
    assert format_rows(rows, "%.5i %A") == ["JOBID SLURM_JOBIDS", "    3 41,42", "    4 -",
                                            "    5 -"]
