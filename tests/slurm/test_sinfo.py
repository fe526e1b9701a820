"""Parsing sinfo --json captured from the live Slurm 22.05 cluster."""

from __future__ import annotations

import json
from pathlib import Path

from weave_slurm.slurm.sinfo import parse_nodes

FIX = Path(__file__).parent / "fixtures"


def test_idle_cluster_nodes() -> None:
    nodes = parse_nodes((FIX / "sinfo_22.05_idle.json").read_text())
    assert [n.name for n in nodes] == ["h20-0", "h20-1", "h800-0", "h800-1"]
    assert all(n.state == "idle" and n.cpus == 32 and n.gpu_count == 8 for n in nodes)
    assert [n.gpu_type for n in nodes] == ["h20", "h20", "h800", "h800"]
    assert nodes[2].partitions == ("h800",)
    assert all(n.address == "127.0.0.1" for n in nodes)   # NodeAddr: where weaved reaches it


def test_mixed_state_and_defensive_entries() -> None:
    nodes = parse_nodes((FIX / "sinfo_22.05_mixed.json").read_text())
    assert [n.state for n in nodes] == ["mixed", "mixed", "mixed", "idle"]
    doc = {"nodes": [{"name": "x", "state": ["IDLE", "DRAIN"], "gres": "gpu:h20:2(S:0)",
                      "cpus": "bad"}, {"no": "name"}]}
    (node,) = parse_nodes(json.dumps(doc))
    assert node.state == "idle+drain" and node.cpus == 0 and node.address == ""
    assert (node.gpu_type, node.gpu_count) == ("h20", 2)
