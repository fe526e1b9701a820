"""Fixtures of the runtime tests: node daemons for one group on the LocalBackend, and
weaved with the group runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.weaved import rl_config, serving
from weave_slurm.daemon.service import Weaved


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """One rollout (h20) and one training (h800) node daemon as local processes."""
    with running_fleet(tmp_path_factory.mktemp("runtime"), "rt", "weave-test-rt-") as fleet:
        yield fleet


@pytest.fixture
def rl_weaved() -> Iterator[tuple[Weaved, Path, Path]]:
    """weaved with the group runtime on the LocalBackend: (weaved, its socket, shm root)."""
    with public_dir("weaved-rt-") as public, shm_dir("weaved-rt-") as shm, \
            serving(rl_config(public, shm)) as w:
        yield w, w.config.socket, shm
