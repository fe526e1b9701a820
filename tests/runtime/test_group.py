"""The group's layout (runtime/group.py): a node of it is a node daemon, so two GPU
shares of one host are two nodes, named by their daemons' keys, on one Slurm host."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.vocab import Pool


def _share(key: str, host: str) -> NodeRef:
    return NodeRef(key, Pool.ROLLOUT, Path(f"/w/nodes/node-{key}.sock"), host=host)


def test_two_shares_of_one_host_are_two_nodes_of_a_layout() -> None:
    one, two = _share("h20-0.501", "h20-0"), _share("h20-0.502", "h20-0")
    layout = GroupLayout((one, two), (NodeRef("h800-0", Pool.TRAIN, Path("/w/t.sock")),))
    layout.validate()
    assert one != two and one.slurm_host == two.slurm_host == "h20-0"
    assert layout.train[0].slurm_host == "h800-0"   # a whole node: its name


def test_a_node_listed_twice_is_refused_naming_it() -> None:
    ref = NodeRef("h20-0", Pool.ROLLOUT, Path("/w/r.sock"))
    layout = GroupLayout((ref, ref), (NodeRef("h800-0", Pool.TRAIN, Path("/w/t.sock")),))
    with pytest.raises(ConfigError, match=r"rollout node\(s\) h20-0 listed twice; each node "
                                          "of a layout is one node daemon"):
        layout.validate()
