"""Two groups' GPU shares of one h20 host on the session's Slurm cluster of separate
hosts (issue 34, item 1; daemon/node_daemons.py, "Shares").

Two rollout allocations of 4 of a node's 8 GPUs, asked as weaved asks (the row shape of
daemon/allocplan.py, the request of daemon/allocations.py), land on the same h20 host.
Each gets its node daemon as a step (as weaved launches it): both answer, each with its
own store and socket, each seeing only its share's GPUs, disjoint from the other's, as
does a worker it starts; a task of each allocation is pointed at its own share's daemon
by the SPANK plugin. Releasing one share ends its daemon, which removes its own store,
and leaves the other's daemon, store (its job's state) and socket as they were.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.shares import answering, gone, share_daemons, status
from tests.harness.waits import wait_for
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.site import default_site
from weave_slurm.daemon.node_daemons import NodeDaemons, NodeDaemonSettings
from weave_slurm.daemon.records import AllocRow
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.nodes import connect
from weave_slurm.slurm.backend import StepSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def _probe(backend: SlurmCliBackend, row: AllocRow, out: Path, check: str) -> list[str]:
    """A one-task step of ``row``'s allocation (as a job task: no GRES of its own asked)
    that writes its GPUs and the socket the SPANK plugin gave it, after ``check``."""
    path = out / f"{row.alloc_id}-{len(list(out.iterdir()))}"
    handle = backend.launch_step(row.alloc_id or "", StepSpec(
        "probe", ("sh", "-c", f"{check} && echo \"$SLURM_STEP_GPUS|$CUDA_VISIBLE_DEVICES|"
                              f"$WEAVE_NODE_SOCKET\" > {path}.tmp && mv {path}.tmp {path}")))
    wait_for(lambda: backend.poll_step(handle).state.finished, 30, "the probe step")
    assert path.exists(), f"probe of {row.alloc_id} failed its check: {check}"
    return path.read_text().strip().split("|")


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def test_two_groups_gpu_shares_of_one_h20_host_keep_apart(
        slurm_cluster: SessionCluster, shared_tmp: Path) -> None:
    env = dict(slurm_cluster.env)
    munge = env.get("MUNGE_SOCKET")
    backend = SlurmCliBackend(env=env, log_dir=shared_tmp / "steps")
    dirs = weaved_dirs(slurm_cluster.cluster, "")
    (dirs.state / "logs").mkdir(parents=True, exist_ok=True)
    nodes = NodeDaemons(NodeDaemonSettings(dirs.state, remote=True, checkpoint_root=dirs.ckpt,
                                           munge_socket=munge), default_site(), backend)
    rows: list[AllocRow] = []
    try:
        share_daemons(backend, nodes, 4, rows)
        (node,) = set(rows[0].nodes) | set(rows[1].nodes)   # both shares on one host
        refs, first = answering(nodes, rows, node, munge)
        roots = [s["root"] for s in first]
        assert roots == [f"/dev/shm/weave-nodes/{node}.{r.alloc_id}" for r in rows]
        assert [s["allocation"] for s in first] == [r.alloc_id for r in rows]
        gpus = [s["gpus"] for s in first]   # what the workers each daemon starts inherit
        assert [len(g) for g in gpus] == [4, 4] and not set(gpus[0]) & set(gpus[1]), gpus
        out = shared_tmp / "probes"
        out.mkdir()
        for i, ref in enumerate(refs):   # a worker each daemon starts: what it sees
            with connect(ref, 30.0, munge) as client:
                client.call(Op.REGISTER, job=f"w{i}", resident=False)
                client.call(Op.ACTIVATE, job=f"w{i}", phase="rollout", argv=[
                    "sh", "-c", f"echo $CUDA_VISIBLE_DEVICES > {out}/w{i}.tmp && "
                                f"mv {out}/w{i}.tmp {out}/w{i}"])
        workers = [wait_for(partial(_read, out / f"w{i}"), 30, f"worker w{i}'s GPUs")
                   for i in range(2)]
        assert [(w or "").split(",") for w in workers] == gpus
        sockets = [f"/run/weave/node-{node}.{r.alloc_id}.sock" for r in rows]
        assert [str(ref.socket_path) for ref in refs] == sockets
        seen = [_probe(backend, r, out, f"test -S {sock} && test -d {root}")
                for r, sock, root in zip(rows, sockets, roots, strict=True)]
        assert [s[0].split(",") for s in seen] == gpus          # SLURM_STEP_GPUS
        assert [s[1].split(",") for s in seen] == gpus          # CUDA_VISIBLE_DEVICES
        assert [s[2] for s in seen] == sockets                  # the SPANK plugin's
        # releasing group 1's share: its daemon ends and removes its store, group 2's
        # daemon, store and socket stay
        backend.release(rows[0].alloc_id or "")
        wait_for(partial(gone, refs[0], munge), 60, "group 1's node daemon to end")
        _probe(backend, rows[1], out, f"test ! -e {roots[0]} && test ! -e {sockets[0]} "
                                      f"&& test -S {sockets[1]} && test -d {roots[1]}")
        after = status(refs[1], munge)
        assert (after["root"], after["allocation"], after["gpus"]) == \
            (roots[1], rows[1].alloc_id, gpus[1])
        assert [j["job"] for j in after["jobs"]] == ["w1"]   # its job's state is there
    finally:
        for row in rows:
            backend.release(row.alloc_id or "")
        wait_for(lambda: not backend.list_allocations(), 60, "the allocations to end")
