"""The flags of a member's ``ray start`` (weave_slurm/ray_member.py, pure): every port
inside the member's own range, the head's and the rollout node's services apart (they
may share a host), two members' flags disjoint, the declared object store passed on,
explicit addresses; outside a weave role, one line naming what is missing."""

from __future__ import annotations

import re

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.ray_member import head_address, start_args
from weave_slurm.runtime.member_net import MemberNet


def _env(role: str, slot: int, **more: str) -> dict[str, str]:
    net = MemberNet("10.0.0.3", "10.0.0.2", slot)
    return {**net.env(role), "WEAVE_ROLE": role, "WEAVE_JOB_ID": f"j{slot}",
            "WEAVE_OBJECT_STORE_BYTES": "268435456", **more}


def _ports(args: list[str]) -> set[int]:
    out: set[int] = set()
    for arg in args:
        if (m := re.fullmatch(r"--(min-worker-port)=(\d+)", arg)):
            low = int(m.group(2))
        elif (m := re.fullmatch(r"--max-worker-port=(\d+)", arg)):
            out |= set(range(low, int(m.group(1)) + 1))
        elif (m := re.fullmatch(r"--[a-z-]*port=(\d+)", arg)):
            out.add(int(m.group(1)))
    return out


def test_every_port_is_in_the_members_range_and_members_are_disjoint() -> None:
    taken = []
    for slot in (0, 1):
        head, node = start_args(_env("train", slot)), start_args(_env("rollout", slot))
        base, count = int(_env("train", slot)["WEAVE_PORT_BASE"]), \
            int(_env("train", slot)["WEAVE_PORT_COUNT"])
        mine = set(range(base, base + count))
        assert _ports(head) <= mine and _ports(node) <= mine
        assert not _ports(head) & _ports(node)       # both may run on one host
        taken.append(_ports(head) | _ports(node))
        assert f"--address={head_address(_env('rollout', slot))}" in node
        assert head_address(_env("rollout", slot)) == f"10.0.0.3:{base}"
        assert "--node-ip-address=10.0.0.3" in head and "--node-ip-address=10.0.0.2" in node
        assert "--include-dashboard=false" in head
    assert not taken[0] & taken[1]


def test_the_declared_object_store_is_passed_on_and_an_undeclared_one_refused() -> None:
    for role in ("train", "rollout"):
        assert "--object-store-memory=268435456" in start_args(_env(role, 0))
    with pytest.raises(ConfigError, match=r"declares no '\[launch\] object_store_gib'"):
        start_args(_env("train", 0, WEAVE_OBJECT_STORE_BYTES=""))


def test_outside_a_weave_role_it_says_what_is_missing() -> None:
    with pytest.raises(ConfigError, match=r"WEAVE_TRAIN_ADDR.* not set") as info:
        start_args({"WEAVE_ROLE": "train"})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="WEAVE_ROLE='driver'; valid: train, rollout"):
        start_args(_env("train", 0, WEAVE_ROLE="driver"))
