"""Fixtures of the runtime tests: node daemons for one group on the LocalBackend."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One rollout (h20) and one training (h800) node daemon as local processes."""
    from tests.harness.fleet import FleetConfig, NodeFleet
    from weave_slurm.slurm.local_backend import LocalBackend

    state = tmp_path_factory.mktemp("runtime")
    shm = Path(tempfile.mkdtemp(prefix="weave-test-rt-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    fleet = NodeFleet(LocalBackend(state / "backend"),
                      FleetConfig("rt", shm, state, host_mem_gib=0.25))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
        shutil.rmtree(shm, ignore_errors=True)
