"""One Slurm cluster of separate hosts per test session, for every `slurm` test.

The ``slurm_cluster`` fixture (tests/conftest.py) calls :func:`start` once: 2 h20 + 2
h800 nodes (:data:`tests.harness.hosts.LAYOUT`), each a host of its own (own network,
/dev/shm, /tmp, /run; only ``<state>/shared/{home,work,ckpt}`` in common), under the
session's base temp dir. The weave SPANK plugin is built on the login side and
loaded (optional): ``up`` copies it into the site dir every host reads, and each
host's slurmd loads it from there; its socket dir is node-local (``/run/weave``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.hosts import LAYOUT, bring_up
from weave_slurm.slurm.cluster_config import SharedPaths
from weave_slurm.slurm.command_runner import run_command
from weave_slurm.slurm.local_cluster import ClusterStatus, LocalCluster

REPO = Path(__file__).resolve().parents[2]
SPANK_SRC = REPO / "spank"   # the plugin's source (weave_slurm/spank/ links to it)
SOCKET_DIR = Path("/run/weave")               # the plugin's sockdir: each host's own /run


@dataclass(frozen=True)
class SessionCluster:
    cluster: LocalCluster
    status: ClusterStatus
    env: dict[str, str]
    spank_plugin: Path   # the copy every host loads (plugstack.conf names it)
    socket_dir: Path

    @property
    def shared(self) -> SharedPaths:
        """The shared file systems (home, work, ckpt): the same on every host and the login."""
        return self.cluster.shared_paths()

    @property
    def nodes(self) -> tuple[str, ...]:
        return LAYOUT.node_names()


def build_spank(out_dir: Path) -> Path:
    """``make -C spank OUT=<out_dir>``; returns the built weave.so."""
    run_command(["make", "-s", "-C", str(SPANK_SRC), f"OUT={out_dir}"], timeout_s=120)
    return out_dir / "weave.so"


@contextmanager
def session_cluster(factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    """The session's cluster, up (with the plugin) and, at the end, down: every process
    of it ended, steps and login-side sruns included."""
    base = factory.getbasetemp() / "weave-slurm-session"
    plugin = build_spank(base / "spank")
    cluster = LocalCluster(base / "cluster")
    try:
        status = bring_up(cluster, LAYOUT, spank_plugin=plugin, socket_dir=SOCKET_DIR)
        loaded = cluster.paths.site_dir / plugin.name
        assert loaded.is_file() and str(loaded) in cluster.paths.plugstack_conf.read_text()
        yield SessionCluster(cluster, status, dict(cluster.env), loaded, SOCKET_DIR)
    finally:
        cluster.down()
