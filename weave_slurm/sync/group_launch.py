"""Start a sync group as real processes: in loopback, across an emulated slow link, or
on the hosts of a separate-hosts Slurm cluster.

:func:`run_group` writes the scenario, starts one :mod:`weave_slurm.sync.group_rank` per
rank (training ranks in the training namespace, rollout ranks in the rollout one; or
each rank on its node's host of a cluster, :class:`ClusterHosts`; or all of them under
``mpirun`` for the MPI backend), waits with a deadline, and returns the per-rank
results. ``python -m weave_slurm.sync.group_launch`` is the standalone entry point used for
benchmarking (see ``--help``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.slurm.host_plan import NODE_IFNAME, HostPlan
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec, run_ip
from weave_slurm.sync.scenario import Backend, Method, Scenario
from weave_slurm.sync.sync_errors import SyncError
from weave_slurm.sync.topology import RankInfo
from weave_slurm.vocab import Pool

if TYPE_CHECKING:
    from weave_slurm.slurm.local_cluster import LocalCluster

log = logging.getLogger(__name__)

GRACE_S = 60.0


@dataclass(frozen=True)
class RankOutcome:
    """One rank process: its exit code, its JSON result (None if it wrote none), stderr."""

    rank: int
    returncode: int | None
    result: dict[str, Any] | None
    stderr: str


class Place(Protocol):
    """Where one rank runs: its address, how to start a command there, its environment."""

    @property
    def addr(self) -> str: ...

    def wrap(self, argv: Sequence[str]) -> list[str]: ...

    def env(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class HostEndpoint:
    """A host of a separate-hosts cluster: ``prefix`` is the nsenter argv that enters it."""

    node: str
    addr: str
    prefix: tuple[str, ...]
    ifname: str = NODE_IFNAME

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]

    def env(self) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": self.ifname}


class ClusterHosts:
    """The hosts of a separate-hosts Slurm cluster (``weave cluster up --hosts separate``)
    as the places of a sync group: training ranks on the hosts of ``train_partition``,
    rollout ranks on those of ``rollout_partition``, spread over as many hosts as there
    are ranks. Each rank is a process started in its host's namespaces
    (``LocalCluster.host_argv``) and uses the host's own interface for gloo. What the
    ranks read and write must be on the cluster's shared file systems."""

    def __init__(self, cluster: LocalCluster, train_partition: str = "h800",
                 rollout_partition: str = "h20") -> None:
        plan = cluster.hosts_plan()
        if plan is None:
            raise StateError(f"sync on hosts: the cluster in {cluster.paths.state_dir} has "
                             "no separate hosts; bring it up with 'weave cluster up --hosts "
                             "separate'")
        self.cluster, self.plan = cluster, plan
        self.nodes = {Pool.TRAIN: _hosts_of(plan, train_partition),
                      Pool.ROLLOUT: _hosts_of(plan, rollout_partition)}
        self._train_end = _train_side_end(plan, train_partition)
        self.shared = cluster.shared_paths()
        self._endpoints = {n.name: self._checked(n.name, n.addr) for n in plan.nodes
                           if n.name in (*self.nodes[Pool.TRAIN], *self.nodes[Pool.ROLLOUT])}

    @property
    def scratch_root(self) -> Path:
        """A directory every host sees (the cluster's shared work dir)."""
        return self.shared.work

    def _checked(self, node: str, addr: str) -> HostEndpoint:
        """The host's endpoint, once its gloo interface is seen to carry its address."""
        argv = self.cluster.host_argv(node, ["ip", "-o", "-4", "addr", "show", "dev",
                                             NODE_IFNAME])
        shown = run_ip(argv, check=False)
        if f" {addr}/" not in shown.stdout:
            said = (shown.stdout or shown.stderr).strip()
            raise StateError(f"sync on hosts: {node} has no {NODE_IFNAME} with {addr} "
                             f"({' '.join(argv)} said {said!r}); is the cluster up? "
                             "'weave cluster status'")
        return HostEndpoint(node, addr, tuple(self.cluster.host_argv(node, [])))

    def endpoint(self, node: str) -> HostEndpoint:
        try:
            return self._endpoints[node]
        except KeyError:
            raise ConfigError(f"sync on hosts: rank node {node!r} is not a host of the "
                              f"cluster's pools; hosts: {', '.join(self._endpoints)}") from None

    def place(self, sc: Scenario) -> Scenario:
        """``sc`` with its ranks on the hosts; files it names must be on a shared path."""
        if sc.backend is not Backend.GLOO:
            raise ConfigError(f"sync on hosts: backend {sc.backend.value!r} is not supported "
                              "there; use 'gloo'")
        for f in sc.version_files:
            self.require_shared(Path(f))
        return replace(sc, train_nodes=self.nodes[Pool.TRAIN][:sc.n_train],
                       rollout_nodes=self.nodes[Pool.ROLLOUT][:sc.n_rollout])

    def require_shared(self, path: Path) -> None:
        roots = self.shared.all()
        if not any(path.resolve().is_relative_to(r) for r in roots):
            raise ConfigError(f"sync on hosts: {str(path)!r} is not on a shared file system, "
                              f"so the hosts cannot see it; put it under one of "
                              f"{', '.join(str(r) for r in roots)}")

    def wire_bytes(self) -> int:
        """Bytes the inter-pool link has carried from the training pool to the rollout
        pool so far (the kernel's counter of the link's training-side end)."""
        done = run_ip(["ip", "-s", "-j", "link", "show", "dev", self._train_end])
        return int(json.loads(done.stdout)[0]["stats64"]["tx"]["bytes"])


def _hosts_of(plan: HostPlan, partition: str) -> tuple[str, ...]:
    names = tuple(n.name for n in plan.nodes if n.pool == partition)
    if not names:
        parts = sorted({n.pool for n in plan.nodes})
        raise ConfigError(f"sync on hosts: no host in partition {partition!r}; partitions: "
                          f"{', '.join(parts)}")
    return names


def _train_side_end(plan: HostPlan, train_partition: str) -> str:
    """The end of the inter-pool veth pair on the training pool's bridge."""
    if len(plan.pools) != 2 or plan.pools[1].link is None:
        raise ConfigError(f"sync on hosts: the cluster has {len(plan.pools)} pools "
                          f"({', '.join(p.pool for p in plan.pools)}); it needs exactly two")
    hub_end, pool_end = plan.pools[1].link
    return pool_end if plan.pools[1].pool == train_partition else hub_end


Site = LinkSpec | EmulatedLink | ClusterHosts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_argv(spec: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "weave_slurm.sync.group_rank", str(spec), str(results)]


def _places(site: EmulatedLink | ClusterHosts) -> tuple[Callable[[RankInfo], Place], int]:
    """Where each rank runs, and the rendezvous port (on the first training rank's place)."""
    if isinstance(site, ClusterHosts):
        return (lambda info: site.endpoint(info.node)), random.randint(20000, 60000)
    loopback = site.endpoint(Pool.TRAIN).netns is None
    return ((lambda info: site.endpoint(info.pool)),
            _free_port() if loopback else random.randint(20000, 60000))


def _spawn_gloo(sc: Scenario, site: EmulatedLink | ClusterHosts, spec: Path, results: Path
                ) -> list[subprocess.Popen[bytes]]:
    topo = sc.topology()
    place, port = _places(site)
    master = place(topo.info(topo.train_ranks[0]))
    procs = []
    for info in topo.ranks:
        ep = place(info)
        env = {**os.environ, **ep.env(), "WEAVE_SYNC_RANK": str(info.rank),
               "WEAVE_SYNC_INIT": f"tcp://{master.addr}:{port}", "OMP_NUM_THREADS": "1"}
        err = (results / f"rank{info.rank}.err").open("wb")
        procs.append(subprocess.Popen(ep.wrap(_worker_argv(spec, results)), env=env,
                                      stdout=subprocess.DEVNULL, stderr=err))
        err.close()
    return procs


def _spawn_mpi(sc: Scenario, link: EmulatedLink | ClusterHosts, spec: Path, results: Path
               ) -> list[subprocess.Popen[bytes]]:
    if isinstance(link, ClusterHosts) or link.endpoint(Pool.TRAIN).netns is not None:
        raise ConfigError("backend 'mpi' runs in loopback mode only (LinkSpec(rate_mbit=None))")
    n = sc.topology().world_size
    env = {**os.environ, "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
           "OMPI_MCA_oob_tcp_if_include": "lo", "OMP_NUM_THREADS": "1"}
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            *_worker_argv(spec, results)]
    err = (results / "mpirun.err").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    return [proc]


def run_group(sc: Scenario, link: Site, workdir: Path | None = None) -> list[RankOutcome]:
    """Run ``sc`` to completion; one outcome per rank, by rank.

    ``link`` is either a spec (a link is created and removed around the run), an
    already entered :class:`EmulatedLink` (reused across runs), or the hosts of a
    cluster (:class:`ClusterHosts`: ``sc`` is placed on them, and ``workdir`` defaults
    to their shared scratch root). The whole run is bounded by ``len(versions) *
    timeout_s + GRACE_S``; ranks still alive then, or when the caller is interrupted,
    are killed.
    """
    if isinstance(link, LinkSpec):
        with EmulatedLink(link) as emu:
            return run_group(sc, emu, workdir)
    if isinstance(link, ClusterHosts):
        sc, workdir = link.place(sc), workdir or link.scratch_root
        link.require_shared(workdir)
    with tempfile.TemporaryDirectory(prefix="weave-sync-", dir=workdir) as tmp:
        results = Path(tmp)
        spec = results / "scenario.json"
        sc.dump(spec)
        spawn = _spawn_mpi if sc.backend is Backend.MPI else _spawn_gloo
        procs = spawn(sc, link, spec, results)
        deadline = time.monotonic() + len(sc.versions) * sc.timeout_s + GRACE_S
        try:
            codes = [_wait(p, deadline) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outcomes = []
        for rank in range(sc.topology().world_size):
            res_path, err_path = results / f"rank{rank}.json", results / f"rank{rank}.err"
            if sc.backend is Backend.MPI:
                err_path = results / "mpirun.err"
            code = codes[0] if sc.backend is Backend.MPI else codes[rank]
            outcomes.append(RankOutcome(
                rank, code, json.loads(res_path.read_text()) if res_path.exists() else None,
                err_path.read_text(errors="replace") if err_path.exists() else ""))
        return outcomes


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def write_weights(path: Path, data: torch.Tensor) -> str:
    """Write a flat ``uint8`` weight buffer where worker ranks can attach it."""
    data.numpy().tofile(path)
    return str(path)


def check_outcomes(outcomes: list[RankOutcome]) -> list[dict[str, Any]]:
    """Results of a run that must have succeeded everywhere, else a SyncError with evidence."""
    for o in outcomes:
        if o.result is None or o.returncode != 0:
            tail = o.stderr.strip().splitlines()[-3:]
            raise SyncError(f"sync rank {o.rank} exited {o.returncode} without a result: "
                            f"{' | '.join(tail)}")
        bad = [s for s in o.result["steps"] if not s["ok"]]
        if bad:
            raise SyncError(f"sync rank {o.rank}: {bad[0]['error']}: {bad[0]['message']}")
    return [o.result for o in outcomes if o.result is not None]


def main(argv: list[str] | None = None) -> int:
    """Standalone: sync random weights (one full version, then one delta) and print timings."""
    ap = argparse.ArgumentParser(prog="python -m weave_slurm.sync.group_launch",
                                 description=main.__doc__)
    ap.add_argument("--train", type=int, default=2, help="training ranks")
    ap.add_argument("--rollout", type=int, default=2, help="rollout ranks")
    ap.add_argument("--mib", type=int, default=64, help="weights, MiB")
    ap.add_argument("--method", choices=[m.value for m in Method], default="twotier")
    ap.add_argument("--mode", choices=["full", "delta"], default="full")
    ap.add_argument("--changed", type=float, default=0.01, help="fraction changed in v2")
    ap.add_argument("--link-mbit", type=int, default=0, help="0 = loopback, no netns")
    ap.add_argument("--backend", choices=[b.value for b in Backend], default="gloo")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    n = args.mib << 20
    with tempfile.TemporaryDirectory(prefix="weave-sync-w-", dir="/dev/shm") as d:
        v1 = torch.randint(0, 256, (n,), dtype=torch.uint8)
        v2 = v1.view(torch.int16).clone()
        idx = torch.randperm(v2.numel())[:int(args.changed * v2.numel())]
        v2[idx] += 1
        files = (write_weights(Path(d) / "v1", v1), write_weights(Path(d) / "v2",
                                                                  v2.view(torch.uint8)))
        sc = Scenario("standalone", args.train, args.rollout, n, files, (1, 2),
                      method=Method(args.method), mode=SyncMode[args.mode.upper()],
                      backend=Backend(args.backend))
        link = LinkSpec(args.link_mbit or None)
        results = check_outcomes(run_group(sc, link))
    for v in range(2):
        steps = [r["steps"][v] for r in results]
        print(json.dumps({"version": v + 1, "time_s": max(s["elapsed_s"] for s in steps),
                          "identical": all(s.get("identical", True) for s in steps),
                          "slow_link_bytes": sum(s["slow_link_bytes"] for s, r in
                                                 zip(steps, results, strict=True)
                                                 if r["pool"] == "train")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
