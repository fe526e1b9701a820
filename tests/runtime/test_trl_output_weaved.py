"""A hosted job's --output through weaved (LocalBackend, real node daemons and resident
workers): the shipped TRL example's own per-step log lines (transformers'
``PrinterCallback``: ``{'loss': ..., 'reward': ...}``), printed by its workers on the
rollout and training nodes, land in the job's output file, appended across phases,
between weaved's stamped event lines; ``--error`` gets the workers' stderr."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_config, serving, wait_states
from tests.runtime.test_trl_weaved import shipped_spec
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved

pytest.importorskip("trl")
pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture
def weaved_public(monkeypatch: pytest.MonkeyPatch,
                  tmp_path: Path) -> Iterator[tuple[Weaved, Path]]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with public_dir("weaved-trl-out-") as public, shm_dir("weaved-trl-out-") as shm, \
            serving(rl_config(public, shm)) as w:
        logs = public / "logs"
        logs.mkdir()
        logs.chmod(0o777)
        yield w, logs


def trl_lines(text: str) -> list[dict[str, Any]]:
    """The lines of ``text`` that are TRL's per-step log dicts."""
    out = []
    for line in text.splitlines():
        if line.startswith("{") and "'loss'" in line:
            out.append(ast.literal_eval(line))
    return out


def test_a_hosted_jobs_output_file_gets_trls_own_log_lines(
        weaved_public: tuple[Weaved, Path]) -> None:
    w, logs = weaved_public
    spec = shipped_spec("trl-out", 7).replace("iterations = 3", "iterations = 2")
    spec += f'\n[slurm]\noutput = "{logs}/%x-%j.out"\nerror = "{logs}/%x-%j.err"\n'
    job = call(w.config.socket, Op.SUBMIT, spec=spec, source="trl-out.toml")["job"]
    rows = wait_states(w.config.socket, [job], {"COMPLETED", "FAILED"}, 240, [])
    assert rows[0]["state"] == "COMPLETED", rows
    path = logs / f"trl-out-{job}.out"
    out = wait_for(path.read_text, 10, "weaved's COMPLETED line",
                   until=lambda text: ": COMPLETED" in text)
    steps = trl_lines(out)
    assert len(steps) == 2, out                # one per training step, as TRL logs
    assert all({"loss", "reward", "grad_norm", "learning_rate"} <= set(s) for s in steps)
    events = [line for line in out.splitlines() if f" weave job {job} (trl-out): " in line]
    assert ": COMPLETED" in events[-1], out
    lines = out.splitlines()
    running = next(i for i, line in enumerate(lines) if ": RUNNING" in line)
    first_trl = next(i for i, line in enumerate(lines) if line.startswith("{'"))
    completed = next(i for i, line in enumerate(lines) if ": COMPLETED" in line)
    assert running < first_trl < completed, out   # in time order with weaved's lines
    err = (logs / f"trl-out-{job}.err").read_text()
    assert "'loss'" not in err                 # stdout is not in --error
