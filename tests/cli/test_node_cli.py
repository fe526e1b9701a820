"""``weave node serve`` path expansion: one argv for every node of a step, no shell."""

from __future__ import annotations

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
