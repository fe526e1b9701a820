"""Two GPU shares of one host in one group, through weaved on the LocalBackend with real
node daemons (issue 34): a pooled group changes its width by asking a new allocation
beside the old one and returning the old once nothing runs on it, and on a small pool
the new share lands on a host where the group already holds one. The group's runtime
names each share's node by its node daemon's key (``<host>.<job id>``,
daemon/node_daemons.py, "Shares"), so the two shares of one host are two nodes: the
plan re-pins the member from the first share to the second, the runtime follows, the
first share is returned, and the member ends with its solo run's weights.

The plan's ``rollout_gpus`` and pins are written here as a pooled placement would write
them (placement does not set ``rollout_gpus`` yet: docs/daemon.md, "GPU shares"); the
rest is weaved's own: the allocations it asks, the runtime that follows the plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, release_all, rl_site, serve, wait_states
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.allocations import alloc_request
from weave_slurm.daemon.group_runtime import GroupRuntime
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, MemberPlan
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.states import AllocState, GroupState
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch

SEED = 61
#: Enough iterations that the member still runs after its two moves (each waits for
#: an allocation and its node daemon to start).
ITERATIONS = 150
#: Planned with the declared profile only: a measured one fed back would re-plan the group.
SITE = "[pools.rollout]\n[pools.train]\n[runtime]\nplan_from_measurements = false\n"


@pytest.fixture
def cfg() -> Iterator[DaemonConfig]:
    with rl_site("weaved-sh-", SITE) as config:
        yield config


def _repin(w: Weaved, job: int, slot: int) -> None:
    """The group's plan as a pooled placement writes it: rollout slots of 4-GPU shares,
    ``job`` pinned to ``slot`` (the next row's: weaved asks for it)."""
    group = w.store.group(1)
    assert group is not None
    plan = group.plan
    (member,) = plan.members
    w.store.update("group", 1, plan=dataclasses.replace(
        plan, members=(MemberPlan(job, (slot,), member.turns),), rollout_gpus=4).to_json())


def _rollouts(w: Weaved, job: int) -> list[str]:
    """The nodes of ``job``'s rollouts, in order (the runtime's names)."""
    spans = getattr(w.driver, "spans", {}).get(1, [])
    return [s.node for s in spans if s.job_id == str(job) and s.kind is Phase.ROLLOUT and s.ok]


def _rollout_rows(w: Weaved) -> list[AllocRow]:
    return [r for r in w.store.allocs(1, live_only=False) if r.role == "rollout"]


def _held_share(w: Weaved, index: int) -> AllocRow:
    """The group's ``index``-th rollout row, once held (a share: 4 GPUs)."""
    rows = wait_for(lambda: _rollout_rows(w), 90, f"rollout row {index} held",
                    interval_s=0.2, until=lambda rows: len(rows) > index
                    and rows[index].state is AllocState.HELD)
    row = rows[index]
    assert row.gpus_per_node == 4, row
    return row


def _runs_on(w: Weaved, job: int, key: str) -> None:
    wait_for(lambda: _rollouts(w, job), 120, f"job {job}'s rollouts on {key}",
             interval_s=0.2, until=lambda nodes: bool(nodes) and nodes[-1] == key)


def _released(w: Weaved, index: int) -> AllocRow:
    rows = settle(lambda: _rollout_rows(w), 60, interval_s=0.2,
                  until=lambda rows: rows[index].state is AllocState.RELEASED)
    assert rows[index].state is AllocState.RELEASED, rows[index]
    return rows[index]


def _occupy(w: Weaved, host: str) -> str:
    """Someone else's job takes every GPU of ``host`` (the pool is small)."""
    other = GroupRow(99, "other", GroupState.ACTIVE, GroupPlan(1, 0, ()), 0.0, "")
    row = AllocRow(99, 99, "rollout", "h20-0", "h20", 1, 8, "h20", 1, AllocState.WANTED,
                   None, (), "")
    got = w.backend.allocate(alloc_request(other, row, 30, "someone_else"))
    assert got.nodes == (host,), got
    return got.alloc_id


def test_a_member_moves_between_two_shares_of_one_host_and_ends_as_solo(
        cfg: DaemonConfig) -> None:
    served = serve(cfg)
    w, sock = served.weaved, cfg.socket
    try:
        a = int(call(sock, Op.SUBMIT, spec=job_spec_toml("shares", iterations=ITERATIONS,
                                                         seed=SEED, options=OPTIONS),
                     source="shares.toml")["job"])
        wait_for(lambda: w.driver.live(a), 180, f"job {a} at version 1", interval_s=0.1,
                 until=lambda live: live is not None and live["version"] >= 1)
        (whole,) = _rollout_rows(w)
        assert (whole.nodes, whole.gpus_per_node) == (("h20-0",), 8)

        # the group becomes a pool of 4-GPU shares: its first share lands on h20-1 (h20-0
        # is still the group's whole node), the whole node is returned once a left it
        _repin(w, a, 1)
        first = _held_share(w, 1)
        assert first.nodes == ("h20-1",)
        _runs_on(w, a, f"h20-1.{first.alloc_id}")
        _released(w, 0)

        # the pool is small: h20-0 is taken, so the group's next share lands on h20-1
        # beside its first; the member moves over to it, and the first is returned
        _occupy(w, "h20-0")
        _repin(w, a, 2)
        second = _held_share(w, 2)
        assert second.nodes == ("h20-1",) and second.alloc_id != first.alloc_id
        second_key = f"h20-1.{second.alloc_id}"
        _runs_on(w, a, second_key)
        live = w.driver.live(a)
        assert live is not None and live["version"] < ITERATIONS, live   # it moved running
        released = _released(w, 1)
        assert "no member of group 1 is pinned to its node(s) h20-1 any more" in \
            w.store.transitions("alloc", released.key)[-2].reason
        assert isinstance(w.driver, GroupRuntime)
        port = w.driver.ports[1]
        assert [n.name for n in port.layout.rollout] == [second_key]
        assert port.layout.rollout[0].slurm_host == "h20-1"

        rows = wait_states(sock, [a], {"COMPLETED", "FAILED"}, 300, [])
        assert rows[0]["state"] == "COMPLETED", rows
        assert set(_rollouts(w, a)) == {"h20-0", f"h20-1.{first.alloc_id}", second_key}
        _matches_solo(w, a)
    finally:
        served.stop()
        release_all(w.backend)


def _matches_solo(w: Weaved, job: int) -> None:
    live: dict[str, Any] | None = w.driver.live(job)
    assert live is not None and live["version"] == ITERATIONS
    solo = run_solo(MemberSpec(str(job), seed=SEED, steps=ITERATIONS, options=OPTIONS))
    assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"

