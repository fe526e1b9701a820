"""Hostlist expressions as squeue and sinfo print them."""

from __future__ import annotations

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.hostlist import expand


@pytest.mark.parametrize(("expr", "names"), [
    ("h20-[0-1]", ("h20-0", "h20-1")),
    ("h20-0", ("h20-0",)),
    ("h20-[0-1],h800-1", ("h20-0", "h20-1", "h800-1")),
    ("n[1,3-4]", ("n1", "n3", "n4")),
    ("n[08-10]", ("n08", "n09", "n10")),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("", ()),
    ("(null)", ()),
])
def test_expand(expr: str, names: tuple[str, ...]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("bad", ["n[1-", "n[a-b]", "n[1-2"])
def test_bad_expressions_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="hostlist"):
        expand(bad)
