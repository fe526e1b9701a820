"""Node daemons of GPU shares (daemon/node_daemons.py, "Shares"): two groups' shares of
one node each have a daemon whose store, socket and budget are their own,
keyed by the allocation; a whole-node allocation keeps the per-node names."""

from __future__ import annotations

import itertools
from functools import partial
from pathlib import Path

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.shares import answering, gone, share_daemons, status
from tests.harness.waits import wait_for
from weave_slurm.config.site import default_site
from weave_slurm.daemon.node_daemons import NodeDaemons, NodeDaemonSettings
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow
from weave_slurm.daemon.states import AllocState, GroupState
from weave_slurm.errors import StateError
from weave_slurm.slurm.local_backend import LocalBackend
from weave_slurm.vocab import Pool

ROOTS = NodeDaemonSettings(Path("/w/state"), instance="i1", remote=True,
                           shm_root=Path("/dev/shm/wn"), node_socket_dir=Path("/run/weave"),
                           checkpoint_root=Path("/shared/ckpt"), python="/opt/py")


def _row(key: int, gpus: int, alloc_id: str | None = "501") -> AllocRow:
    return AllocRow(key, key, "rollout", "h20-0", "h20", 1, gpus, "h20", 1,
                    AllocState.HELD, alloc_id, ("h20-0",), "")


def _daemons() -> NodeDaemons:
    return NodeDaemons(ROOTS, default_site(), None)  # type: ignore[arg-type]  # no backend


def _options(argv: tuple[str, ...]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}


def test_two_shares_of_a_node_have_daemons_of_their_own() -> None:
    nodes = _daemons()
    one, two = _options(nodes.command(_row(1, 4, "501"))), \
        _options(nodes.command(_row(2, 4, "502")))
    assert one["--root"] == "/dev/shm/wn/i1/{node}.501"
    assert one["--socket"] == "/run/weave/i1/node-{node}.501.sock"
    assert two["--root"] == "/dev/shm/wn/i1/{node}.502"
    for key in ("--root", "--socket"):
        assert one[key] != two[key]
    # checkpoints per job in the node's root, where a lost node's are looked for
    assert one["--checkpoint-root"] == two["--checkpoint-root"] == "/shared/ckpt/i1/{node}"
    # the node's 2048 GiB of warm state in proportion to the share's 4 of 8 GPUs
    assert one["--host-mem-gib"] == "1024"
    group = GroupRow(1, "i1.1", GroupState.ACTIVE, GroupPlan(1, 1, ()), 0.0, "")
    assert nodes.step(group, _row(1, 4)).env["WEAVE_SHM_BUDGET_GIB"] == "1024"


def test_weaved_reaches_each_share_at_its_own_socket() -> None:
    nodes = NodeDaemons(NodeDaemonSettings(Path("/w/state"), instance="i1"), default_site(),
                        None)  # type: ignore[arg-type]   # local: ref() asks no backend
    ref = nodes.ref(_row(1, 4, "7"), "h20-0", Pool.ROLLOUT)
    assert ref.socket_path == Path("/w/state/nodes/node-h20-0.7.sock")
    whole = nodes.ref(_row(1, 8, "7"), "h20-0", Pool.ROLLOUT)
    assert whole.socket_path == Path("/w/state/nodes/node-h20-0.sock")


def test_a_whole_node_keeps_the_per_node_names() -> None:
    argv = _options(_daemons().command(_row(1, 8)))
    assert argv["--root"] == "/dev/shm/wn/i1/{node}"
    assert argv["--socket"] == "/run/weave/i1/node-{node}.sock"
    assert argv["--host-mem-gib"] == "2048"


def test_a_share_not_held_yet_has_no_key() -> None:
    with pytest.raises(StateError, match="not held yet, its node daemon has no key"):
        _daemons().node_key(_row(1, 4, None), "h20-0")


@pytest.mark.torch
def test_two_shares_of_a_local_node_run_their_daemons_side_by_side() -> None:
    """On the local backend (real ``weave node serve`` processes): two groups' 4-GPU
    shares land on one node, both daemons answer from their own store with their own
    GPUs; releasing one ends its daemon and removes its store only."""
    with public_dir("weave-shares-") as public, shm_dir("weave-shares-") as shm:
        backend = LocalBackend(public / "local")
        nodes = NodeDaemons(NodeDaemonSettings(public / "state", shm_root=shm),
                            default_site(), backend)
        rows: list[AllocRow] = []
        try:
            share_daemons(backend, nodes, 4, rows)
            (node,) = {n for r in rows for n in r.nodes}
            refs, first = answering(nodes, rows, node)
            roots = [Path(s["root"]) for s in first]
            assert roots == [shm / f"{node}.{r.alloc_id}" for r in rows]
            assert [s["gpus"] for s in first] == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
            backend.release(rows[0].alloc_id or "")
            wait_for(partial(gone, refs[0]), 30, "the released share's node daemon to end")
            wait_for(lambda: not roots[0].exists(), 30, "its store to be removed")
            assert status(refs[1])["root"] == str(roots[1]) and roots[1].is_dir()
        finally:
            for row in rows:
                backend.release(row.alloc_id or "")
            wait_for(lambda: not any(shm.iterdir()), 30, "every share's store to be removed")
