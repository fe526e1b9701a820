"""sbatch's --dependency forms (config/dependency.py) and --hold, in a spec and in
#SBATCH lines."""

from __future__ import annotations

import pytest

from weave_slurm.config.dependency import Dependency, dependency_text, parse_dependency
from weave_slurm.daemon.submission import read_directives
from weave_slurm.errors import ConfigError


def test_forms_as_sbatch_writes_them() -> None:
    assert parse_dependency("afterok:12:13,after:3") == (
        Dependency("afterok", (12, 13)), Dependency("after", (3,)))
    assert dependency_text(" afterany:7 , afternotok:8") == "afterany:7,afternotok:8"


@pytest.mark.parametrize(("text", "needle"), [
    ("afterok", "'afterok' is not a dependency; valid: TYPE:ID"),
    ("afterwhat:3", "'afterwhat:3' is not a dependency"),
    ("afterok:x", "'afterok:x' is not a dependency"),
    ("afterok:1?afterok:2", "'?' (any of) is not taken"),
    ("singleton", "'singleton' is not a dependency"),
])
def test_bad_forms_are_one_line_naming_them(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("?", r"\?").replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_dependency(text)


def test_sbatch_lines_d_and_H() -> None:
    found = read_directives("#!/bin/sh\n#SBATCH -d afterok:4 -H\n#SBATCH --hold\n", "s.sh")
    assert found == {"dependency": "afterok:4", "hold": True}
