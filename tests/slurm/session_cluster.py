"""One local Slurm cluster per test session, shared by tests/slurm and tests/spank.

Both conftests call :func:`start`; the cluster lives in one directory under the
session's base temp dir, so the second call finds it up (``up`` is idempotent).
The weave SPANK plugin is built into the same directory and loaded (optional).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from weave_slurm.slurm.cluster import ClusterStatus, LocalCluster
from weave_slurm.slurm.runner import run_command

REPO = Path(__file__).resolve().parents[2]
SPANK_SRC = REPO / "weave_slurm" / "spank"   # the plugin's source: package data


@dataclass(frozen=True)
class SessionCluster:
    cluster: LocalCluster
    status: ClusterStatus
    env: dict[str, str]
    spank_plugin: Path
    socket_dir: Path


def build_spank(out_dir: Path) -> Path:
    """``make -C weave_slurm/spank OUT=<out_dir>``; returns the built weave.so."""
    run_command(["make", "-s", "-C", str(SPANK_SRC), f"OUT={out_dir}"], timeout_s=120)
    return out_dir / "weave.so"


def start(factory: pytest.TempPathFactory) -> SessionCluster:
    base = factory.getbasetemp() / "weave-slurm-session"
    plugin = build_spank(base / "spank")
    socket_dir = base / "sock"
    cluster = LocalCluster(base / "cluster")
    status = cluster.up(spank_plugin=plugin, socket_dir=socket_dir, timeout_s=60)
    return SessionCluster(cluster, status, dict(cluster.env), plugin, socket_dir)
