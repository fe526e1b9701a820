"""A group whose node daemons weaved reaches as remote hosts: control over TCP with
munge, every segment moved by the sync agents, nothing through weaved's memory.

The daemons run on this host (LocalBackend processes) but each listens on loopback and
its NodeRef carries that address, so the runner takes the paths of separate hosts:
``auto`` picks the ``twotier`` transfer; weights go by the two-tier sync, a rollout's
trajectories point to point from its rollout node's agent to its training node's, a
stale member's ring buffers by the training node's own ``copy``. Members end
bit-identical to their solo runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.munged import private_munged
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, leave_all
from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.errors import ConfigError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer

pytestmark = pytest.mark.torch
STEPS = 3


@pytest.fixture(scope="module")
def munge_socket() -> Iterator[Path]:
    with private_munged() as sock:
        yield sock


@pytest.fixture(scope="module")
def remote_fleet(tmp_path_factory: pytest.TempPathFactory,
                 munge_socket: Path) -> Iterator[NodeFleet]:
    with running_fleet(tmp_path_factory.mktemp("remote"), "rn", "weave-test-rn-",
                       rollout_nodes=2, munge_socket=str(munge_socket)) as fleet:
        yield fleet


def test_members_on_remote_nodes_match_solo(remote_fleet: NodeFleet, munge_socket: Path) -> None:
    layout = remote_fleet.layout
    assert layout is not None and all(n.remote for n in (*layout.train, *layout.rollout))
    specs = [MemberSpec("rn0", seed=61, steps=STEPS, options=OPTIONS, rollout_pins=(0, 1)),
             MemberSpec("rn1", seed=62, steps=STEPS, options=OPTIONS, rollout_pins=(1,),
                        staleness=1)]
    calls: list[Op] = []
    ex = GroupRunner(layout, specs, config=RunnerConfig(
        weight_transfer=WeightTransferKind.AUTO, sync_timeout_s=30.0,
        munge_socket=str(munge_socket)))
    transfer = ex.transfer
    assert isinstance(transfer, TwoTierTransfer) and not transfer.local
    real_call = ex.link.call

    def counted(node: object, op: Op, **args: object) -> dict[str, object]:
        calls.append(op)
        return real_call(node, op, **args)  # type: ignore[arg-type]

    ex.link.call = counted  # type: ignore[method-assign]
    transfer.call = counted
    try:
        ex.run(timeout_s=300)
        assert [ex.members[s.job_id].state for s in specs] == [MemberState.DONE] * 2
        for spec in specs:
            assert_same_as_solo(ex, spec)
        # every weight version by the two-tier sync; the stale member's ring on its
        # training node by the node's own copy; trajectories point to point
        pushed = [r for r in transfer.records if r.job_id == "rn0"]
        assert [r.version for r in pushed] == list(range(STEPS + 1))   # one push per version
        both = {f"rollout:{n.name}" for n in layout.rollout} | {f"train:{layout.train[0].name}"}
        assert all(set(r.replies) == both for r in pushed)             # to both its nodes
        assert Op.COPY in calls
        assert transfer._seq >= 2 * STEPS                  # one send/take per batch
        with pytest.raises(AttributeError):                # a remote client maps nothing
            ex.link.client(layout.train[0]).attach        # noqa: B018
    finally:
        leave_all(ex, specs)


def test_shm_is_refused_where_nodes_are_other_hosts(remote_fleet: NodeFleet) -> None:
    assert remote_fleet.layout is not None
    with pytest.raises(ConfigError, match=r"weight_transfer 'shm': nodes .* are other hosts"):
        GroupRunner(remote_fleet.layout, [],
                    config=RunnerConfig(weight_transfer=WeightTransferKind.SHM))
