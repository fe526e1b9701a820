"""Fixtures of the SPANK tests: the same session cluster as tests/slurm (plugin loaded)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.session_cluster import SessionCluster, start


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    sc = start(tmp_path_factory)
    yield sc
    sc.cluster.down()
