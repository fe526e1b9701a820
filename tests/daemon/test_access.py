"""What a submission checks of a job's output files (daemon/access.py): the default
``weave-%j.out`` is checked like a named one, and a file outside the user's home and
the site's shared roots is said in one line (the nodes may not see that directory)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.access import check_access, output_needs, unshared_outputs
from weave_slurm.errors import ConfigError

NOBODY = 65534


def _spec(extra: str = "") -> str:
    return job_spec_toml("out") + extra


def test_the_default_output_is_in_the_home_and_checked() -> None:
    home = pwd.getpwuid(os.getuid()).pw_dir
    needs = output_needs(parse_job(_spec(), "j.toml"))
    assert [(n.key, n.path) for n in needs] == [("slurm.output", f"{home}/weave-0.out")]
    if os.geteuid() == 0 and pwd.getpwuid(NOBODY).pw_dir == "/nonexistent":
        job = parse_job(_spec(), "j.toml")
        with pytest.raises(ConfigError, match=r"^j.toml: key 'slurm.output' = "
                           r"'/nonexistent/weave-0.out': its directory does not exist"):
            check_access(job, output_needs(job, NOBODY), NOBODY)


def test_an_output_outside_home_and_roots_is_said(tmp_path: Path) -> None:
    job = parse_job(_spec(f'\n[slurm]\noutput = "{tmp_path}/x-%j.out"\n'), "j.toml")
    (line,) = unshared_outputs(job, os.getuid(), ())
    assert line.startswith(f"slurm.output '{tmp_path}/x-0.out' is outside your home and "
                           "this site's shared roots (") and "\n" not in line
    assert unshared_outputs(job, os.getuid(), (tmp_path,)) == []
    assert unshared_outputs(parse_job(_spec(), "j.toml"), os.getuid(), ()) == []
