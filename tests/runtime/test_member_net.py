"""A cooperative member's addresses and ports (runtime/member_net.py): each role is
told both nodes' addresses as their peers reach them and its own node's; port ranges
are disjoint while held, go back when given, and running out is a typed refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import InsufficientResources
from weave_slurm.runtime.group import NodeRef
from weave_slurm.runtime.member_net import MemberNet, PortSlots, node_addr
from weave_slurm.vocab import Pool


def test_a_role_is_told_both_addresses_and_its_own() -> None:
    train = NodeRef("h800-0", Pool.TRAIN, Path("/x"), "10.0.0.3", 4000)
    rollout = NodeRef("h20-0", Pool.ROLLOUT, Path("/y"), "10.0.0.2", 4000)
    net = MemberNet(node_addr(train), node_addr(rollout), slot=2)
    assert net.env("train")["WEAVE_NODE_ADDR"] == "10.0.0.3"
    assert net.env("rollout")["WEAVE_NODE_ADDR"] == "10.0.0.2"
    assert net.env("rollout")["WEAVE_TRAIN_ADDR"] == "10.0.0.3"
    assert node_addr(NodeRef("n", Pool.TRAIN, Path("/z"))) == "127.0.0.1"
    base, count = int(net.env("train")["WEAVE_PORT_BASE"]), \
        int(net.env("train")["WEAVE_PORT_COUNT"])
    assert base + count <= 32768    # under Linux's ephemeral ports


def test_port_slots_are_disjoint_while_held_and_go_back() -> None:
    slots, a, b = PortSlots(slots=2), object(), object()
    assert (slots.take(a, "1"), slots.take(a, "1"), slots.take(b, "1")) == (0, 0, 1)
    with pytest.raises(InsufficientResources, match="all 2 cooperative port ranges"):
        slots.take(a, "2")
    slots.give(a, "1")
    assert slots.take(a, "2") == 0 and slots.held(a) == {"2"}
