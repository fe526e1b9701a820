"""Node daemons of GPU shares (daemon/node_daemons.py, "Shares"): two groups' shares of
one node each have a daemon whose store, socket and budget are their own,
keyed by the allocation; a whole-node allocation keeps the per-node names."""

from __future__ import annotations

import itertools
from dataclasses import replace
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
from weave_slurm.node.remote import ready_line
from weave_slurm.slurm.backend import NodeInfo
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


class _Nodes:
    """The one thing ``ref`` asks Slurm on a remote site: the nodes' addresses."""

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo("h20-0", ("h20",), "idle", 32, "h20", 8, address="10.0.0.5")]


def test_two_shares_of_one_host_are_two_nodes_each_with_its_port(tmp_path: Path) -> None:
    """A group's two shares of one host: two refs, named by their daemons' keys, on the
    same host and address, each at its own socket and the port its own daemon said (in
    its own step's output, under the host's name: SLURMD_NODENAME)."""
    settings = NodeDaemonSettings(tmp_path, instance="i1", remote=True,
                                  node_socket_dir=Path("/run/weave"))
    nodes = NodeDaemons(settings, default_site(), _Nodes())  # type: ignore[arg-type]
    rows = [AllocRow(1, 1, "rollout", pool, "h20", 1, 4, "h20", 1, AllocState.HELD, job,
                     ("h20-0",), "") for pool, job in (("h20-0", "501"), ("h20-1", "502"))]
    for row, port in zip(rows, (4101, 4102), strict=True):
        nodes.log_path(row).parent.mkdir(parents=True, exist_ok=True)
        nodes.log_path(row).write_text(ready_line("h20-0", port) + "\n")
    one, two = (nodes.ref(r, "h20-0", Pool.ROLLOUT) for r in rows)
    assert (one.name, two.name) == ("h20-0.501", "h20-0.502")
    assert one.slurm_host == two.slurm_host == "h20-0"
    assert one.address == two.address == "10.0.0.5"
    assert (one.port, two.port) == (4101, 4102)
    assert (one.socket_path.name, two.socket_path.name) == \
        ("node-h20-0.501.sock", "node-h20-0.502.sock")
    assert (one.alloc_id, two.alloc_id) == ("501", "502")
    nodes.log_path(rows[1]).write_text(ready_line("h20-0", 4203) + "\n")   # relaunched
    assert nodes.resolve(two).port == 4203 and nodes.resolve(one).port == 4101
    whole = replace(rows[0], gpus_per_node=8)
    assert nodes.ref(whole, "h20-0", Pool.ROLLOUT).name == "h20-0"
    assert nodes.ref(whole, "h20-0", Pool.ROLLOUT).host is None


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
