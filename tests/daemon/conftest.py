"""Fixtures of the daemon tests: an in-process weaved on the local backend, job specs,
and (for `slurm` tests) the session's local Slurm cluster from tests/slurm."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from weave_slurm.daemon.service import DaemonConfig, Weaved

SPEC = """\
name = "{name}"
slo = 3.0
[model]
params_b = 0.5
[rollout]
prompts_per_step = 8
samples_per_prompt = 2
max_response_tokens = 256
[gpus]
rollout = 8
train = 8
[profile]
rollout_s = 10.0
train_s = 10.0
rollout_state_gib = 1.0
train_state_gib = 1.0
"""


def spec_text(name: str) -> str:
    return SPEC.format(name=name)


@dataclass
class Running:
    weaved: Weaved
    socket: Path
    state_dir: Path


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every uid can traverse (pytest's tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="weaved-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def weaved(public_dir: Path) -> Iterator[Running]:
    cfg = DaemonConfig(state_dir=public_dir / "state", tick_s=0.1,
                       node_command=("sleep", "infinity"), client_timeout_s=1.0)
    w = Weaved(cfg)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    yield Running(w, cfg.socket, cfg.state_dir)
    for a in w.backend.list_allocations(""):
        w.backend.release(a.alloc_id)
    w.stop()
    t.join(timeout=10)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.slurm.session_cluster import start

    sc = start(tmp_path_factory)
    yield sc
    sc.cluster.down()
