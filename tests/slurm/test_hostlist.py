"""Hostlist expressions as squeue and sinfo print them."""

from __future__ import annotations

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.hostlist import compress, expand


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


@pytest.mark.parametrize(("names", "expr"), [
    (["h20-0", "h20-1"], "h20-[0-1]"),
    (["h20-0", "h20-1", "h20-3", "h800-0"], "h20-[0-1,3],h800-0"),
    (["h20-3", "h20-1", "h20-2"], "h20-[1-3]"),
    (["n08", "n09", "n10"], "n[08-10]"),
    (["login", "h20-5"], "login,h20-5"),
    (["h800-0"], "h800-0"),
    ([], ""),
])
def test_compress_as_slurm_prints_and_expand_inverts_it(names: list[str], expr: str) -> None:
    assert compress(names) == expr
    assert sorted(expand(expr)) == sorted(names)
