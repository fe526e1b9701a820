"""A Slurm cluster whose nodes are separate hosts, for the tests that need one.

Each node is its own network, mount and hostname namespace (``weave cluster up --hosts
separate``); only the cluster's shared file systems are common. The subnet is a free
/24 of 10.214.0.0/16 (no route of this host overlaps it), so two such clusters of
different test sessions do not clash.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from weave_slurm.slurm.cluster import LocalCluster
from weave_slurm.slurm.cluster_config import ClusterLayout, HostMode, PoolShape
from weave_slurm.slurm.runner import run_command

TOOLS = ("slurmd", "ip", "tc", "nsenter", "unshare", "setpriv", "munged")
#: Two h20 and two h800 hosts of 8 (fake) GPUs, as the job specs in configs/jobs ask.
LAYOUT = ClusterLayout((PoolShape("h20", "h20", 2, gpus_per_node=8, cpus_per_node=8),
                        PoolShape("h800", "h800", 2, gpus_per_node=8, cpus_per_node=8)))


def skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("separate hosts need root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"separate hosts need {', '.join(missing)}")


def free_subnet() -> str:
    """A /24 of 10.214.0.0/16 that no route of this host overlaps (other clusters')."""
    res = run_command(["ip", "-o", "-4", "route", "show"])
    taken = [ipaddress.ip_network(line.split()[0], strict=False)
             for line in res.stdout.splitlines() if line.split()[0] != "default"]
    for k in range(100 + os.getpid() % 100, 356):
        net = ipaddress.ip_network(f"10.214.{k % 256}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    pytest.skip("no free /24 in 10.214.0.0/16")


@contextmanager
def hosts_cluster(state: Path, layout: ClusterLayout = LAYOUT,
                  interpool_gbps: float | None = None) -> Iterator[LocalCluster]:
    """A separate-hosts cluster in ``state``, brought down (everything in it) at the end."""
    skip_unless_possible()
    cluster = LocalCluster(state)
    try:
        cluster.up(layout, hosts=HostMode.SEPARATE, subnet=free_subnet(),
                   interpool_gbps=interpool_gbps, timeout_s=60)
        yield cluster
    finally:
        cluster.down()


def on_host(cluster: LocalCluster, node: str, argv: list[str]) -> str:
    """Run ``argv`` on ``node``'s host (in its namespaces); its stdout."""
    return run_command(cluster.host_argv(node, argv), timeout_s=60).stdout
