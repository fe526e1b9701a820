"""Fixtures of the daemon tests: an in-process weaved on the local backend (`slurm` tests
use the session's cluster, ``slurm_cluster`` in tests/conftest.py); README's path on
that cluster, run once for the tests that look at it (``readme_run``). Their job specs
come from :func:`weave_slurm.config.render.job_spec_toml`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import scratch
from tests.harness.readme_path import ReadmeRun, readme_path
from tests.harness.weaved import remove_default_outputs, serving
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.store import Store


@dataclass
class Running:
    weaved: Weaved
    socket: Path
    state_dir: Path


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every uid can traverse (pytest's tmp dirs are 0700); the default
    outputs its weaveds' jobs left in a real home are removed after (a weaved run as a
    process of its own, too)."""
    with scratch.public_dir("weaved-test-") as d:
        yield d
        for db in d.glob("**/weaved.db"):
            remove_default_outputs(db)


@pytest.fixture
def weaved(public_dir: Path) -> Iterator[Running]:
    cfg = DaemonConfig(state_dir=public_dir / "state", tick_s=0.1,
                       node_command=("sleep", "infinity"), client_timeout_s=1.0)
    with serving(cfg, join_s=10) as w:
        yield Running(w, cfg.socket, cfg.state_dir)



@pytest.fixture(scope="session")
def readme_run(slurm_cluster: SessionCluster,
               tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    """README's path with the three shipped examples across a kill -9 of weaved, once
    per session (tests/harness/readme_path.py): test_readme_path and
    test_hosts_acceptance assert on the same run. If the run fails, both fail with its
    error (pytest keeps a session fixture's error)."""
    return readme_path(slurm_cluster, tmp_path_factory.mktemp("readme-path"))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An empty state database (a fresh file of today's schema)."""
    s = Store(tmp_path / "weaved.db")
    yield s
    s.close()
