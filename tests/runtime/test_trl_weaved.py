"""Three TRL GRPO jobs (the shipped configs/jobs/trl/trl-grpo-tiny.toml: TRL's GRPOTrainer
on a tiny random Llama) co-executed as one group through weaved, with the group
runtime on the LocalBackend and real node daemons and workers, end with exactly the
weights (SHA-256) and the per-step rewards of each job run alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.solo import run_solo
from tests.harness.weaved import call, rl_config, serving, wait_states
from weave_slurm.config.job import options_dict, parse_job
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytest.importorskip("trl")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

ITERATIONS = 3
#: In a folder of its own: the specs directly in configs/jobs/ are the planning examples
#: (weave plan goldens), which a toy job would change.
SPEC = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "trl" / "trl-grpo-tiny.toml"


def shipped_spec(name: str, seed: int) -> str:
    """The shipped spec under another name and seed, for :data:`ITERATIONS` steps."""
    text = SPEC.read_text()
    for key, value in (("name", f'"{name}"'), ("seed", str(seed)),
                       ("iterations", str(ITERATIONS))):
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, f"{SPEC}: no top-level key {key!r}"
    return text


@pytest.fixture
def trl_weaved(monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> Iterator[tuple[Weaved, Path]]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")      # the node daemons' workers inherit it
    monkeypatch.chdir(tmp_path)                    # TRL's output_dir of the solo runs
    with public_dir("weaved-trl-") as public, shm_dir("weaved-trl-") as shm, \
            serving(rl_config(public, shm)) as w:
        yield w, shm


def test_three_trl_jobs_in_one_group_match_each_run_alone(
        trl_weaved: tuple[Weaved, Path]) -> None:
    w, shm = trl_weaved
    sock = w.config.socket
    seeds = [41, 42, 43]
    specs = [shipped_spec(f"trl-{i}", seed) for i, seed in enumerate(seeds)]
    ids = [call(sock, Op.SUBMIT, spec=spec, source=f"trl{i}.toml")["job"]
           for i, spec in enumerate(specs)]
    seen: list[dict[str, Any]] = []
    rows = wait_states(sock, ids, {"COMPLETED", "FAILED"}, 300, seen)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    # co-executed: one group, whose members ran their phases round-robin
    assert len({r["group"] for r in seen if r["group"] is not None}) == 1, seen
    assert {r["iter"] for r in rows} == {f"{ITERATIONS}/{ITERATIONS}"}
    digests = set()
    for job, seed, text in zip(ids, seeds, specs, strict=True):
        live = w.driver.live(job)
        assert live is not None
        spec = parse_job(text)
        solo = run_solo(MemberSpec(str(job), seed=seed, steps=ITERATIONS,
                                   options=options_dict(spec.options), entry_point=spec.entry))
        assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"
        assert tuple(live["rewards"]) == solo.rewards, job
        assert solo.version == ITERATIONS
        digests.add(live["weights_sha256"])
    assert len(digests) == 3          # three different jobs, not one job three times
    assert [p for p in shm.rglob("*") if p.name in {str(j) for j in ids}] == []
