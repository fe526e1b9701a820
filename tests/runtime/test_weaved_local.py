"""weaved with the group runtime on the LocalBackend: three reference GRPO jobs,
submitted through the socket as weave-sbatch does, run round-robin in one group on
real node daemons and end with their solo weights bit for bit; nothing is left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import daemons_gone, node_status
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, state_of, wait_states
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved
from weave_slurm.errors import ConfigError
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytestmark = pytest.mark.torch

ITERATIONS = 2


def test_three_jobs_through_weaved_match_solo(rl_weaved: tuple[Weaved, Path, Path]) -> None:
    w, sock, shm = rl_weaved
    ids = [call(sock, Op.SUBMIT, spec=job_spec(f"grpo-{i}", 21 + i, ITERATIONS),
                source=f"job{i}.toml")["job"] for i in range(3)]
    seen: list[dict[str, Any]] = []
    rows = wait_states(sock, ids, {"COMPLETED", "FAILED"}, 240, seen)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    # one group, phases really ran, and ITER counted up to the requested iterations
    assert len({r["group"] for r in seen if r["group"] is not None}) == 1
    phases = {r["phase"] for r in seen}
    assert phases & {"rollout", "train"}, phases
    assert {r["iter"] for r in rows} == {f"{ITERATIONS}/{ITERATIONS}"}
    for i, job in enumerate(ids):
        live = w.driver.live(job)
        assert live is not None
        solo = run_solo(MemberSpec(str(job), seed=21 + i, steps=ITERATIONS, options=OPTIONS))
        assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"
        assert tuple(live["rewards"]) == solo.rewards
        measured = live["measured"]
        assert len(measured["rollout_s"]) == ITERATIONS
        assert measured["train_state_bytes"] > measured["rollout_state_bytes"] > 0
        assert measured["sync_bytes"]["weights"] > 0
        shown = call(sock, Op.SHOW, kind="job", id=job)
        assert shown["runtime"]["version"] == ITERATIONS
        # its layout (1 + 1 GPUs) is what ran: one training rank, one rollout engine
        assert shown["layout"]["words"] == "train 1x1 rank; rollout 1x1 engine x 1 GPU"
        assert shown["layout"]["runs"] is None
    # the group drained: allocations released, node daemons gone, no job state in shm
    settle(lambda: not (w.backend.list_allocations("") or call(sock, Op.GROUPS)["groups"]),
           30, interval_s=0.3)
    assert not w.backend.list_allocations("")
    assert [p for p in shm.rglob("*") if p.name in {str(j) for j in ids}] == []
    assert daemons_gone(w.config.state_dir / "ckpt", 30)


def test_cancel_mid_run_leaves_nothing(rl_weaved: tuple[Weaved, Path, Path]) -> None:
    w, sock, shm = rl_weaved
    keep = call(sock, Op.SUBMIT, spec=job_spec("keep", 1, iterations=2), source="k")["job"]
    gone = call(sock, Op.SUBMIT, spec=job_spec("gone", 2, iterations=50), source="g")["job"]
    wait_for(lambda: w.driver.live(gone), 120, f"job {gone} running a phase at v>=1",
             interval_s=0.2, until=lambda live: live is not None
             and live["phase"] in ("rollout", "train") and live["version"] >= 1)
    assert call(sock, Op.CANCEL, jobs=[gone])["results"][0]["ok"]
    wait_states(sock, [gone], {"CANCELLED"}, 60, [])
    if state_of(sock, keep) == "RUNNING":
        # mid-run: the node daemons serving the group no longer know the cancelled job
        for node_sock in (w.config.state_dir / "nodes").glob("*.sock"):
            jobs = [j["job"] for j in node_status(node_sock)["jobs"]]
            assert str(gone) not in jobs and str(keep) in jobs, (node_sock, jobs)
    rows = wait_states(sock, [keep, gone], {"COMPLETED", "CANCELLED", "FAILED"}, 180, [])
    assert {r["job"]: r["state"] for r in rows} == {keep: "COMPLETED", gone: "CANCELLED"}
    # its segments and checkpoints are gone; once the group drained, so are the daemons
    assert [p for p in shm.rglob("*") if p.name == str(gone)] == []
    ckpt = w.config.state_dir / "ckpt"
    assert [p for p in ckpt.rglob("*") if p.name == str(gone)] == []
    settle(lambda: not w.backend.list_allocations(""), 30, interval_s=0.3)
    assert not w.backend.list_allocations("")
    assert daemons_gone(w.config.state_dir / "ckpt", 20)


def test_cancelling_a_groups_last_job_leaves_nothing(
        rl_weaved: tuple[Weaved, Path, Path]) -> None:
    """The cancel empties the group, which drains in the same reconcile tick: the job's
    state on the nodes is dropped before their daemons are stopped."""
    w, sock, shm = rl_weaved
    job = call(sock, Op.SUBMIT, spec=job_spec("last", 3, iterations=50), source="l")["job"]
    wait_for(lambda: w.driver.live(job), 120, f"job {job} at v>=1", interval_s=0.2,
             until=lambda live: live is not None and live["version"] >= 1)
    assert call(sock, Op.CANCEL, jobs=[job])["results"][0]["ok"]
    wait_states(sock, [job], {"CANCELLED"}, 60, [])
    settle(lambda: not w.backend.list_allocations(""), 30, interval_s=0.3)
    assert daemons_gone(w.config.state_dir / "ckpt", 20)
    assert [p for p in shm.rglob("*") if p.name == str(job)] == []
    assert [p for p in (w.config.state_dir / "ckpt").rglob("*") if p.name == str(job)] == []


def test_a_layout_the_site_would_run_smaller_is_refused_at_submission(
        rl_weaved: tuple[Weaved, Path, Path]) -> None:
    """16 + 16 GPUs whose 16 engines would each draw from one 'batch' stream: refused at
    submission in one line naming the key, nothing stored, instead of failing at run
    time or running rank 0 alone (issue 30; the gangs = false refusal:
    tests/daemon/test_runnable.py). Gangs that run every rank:
    tests/runtime/test_gang_run.py, tests/daemon/test_gang_hosts.py."""
    _w, sock, _shm = rl_weaved
    spec = job_spec_toml("wide", iterations=ITERATIONS, seed=5, options=OPTIONS,
                         rollout_gpus=16, train_gpus=16)
    with pytest.raises(ConfigError) as err:
        call(sock, Op.SUBMIT, spec=spec, source="wide.toml")
    words = str(err.value)
    assert words.startswith("wide.toml: builtin:grpo-toy: options.sampling = 'batch': a "
                            "rollout over 16 engines needs 'per_prompt'"), words
    assert "\n" not in words, words
    assert call(sock, Op.STATUS, all=True)["jobs"] == []
