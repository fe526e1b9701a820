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
from weave_slurm.daemon.layout_view import RANK0_ONLY
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase

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
        # its layout (8 + 8 GPUs on the default site's 8-GPU nodes) is more than the one
        # process per role that ran, and show job says so (no gangs yet: issue 15, item 2)
        assert shown["layout"]["words"] == "train 1x8 ranks; rollout 1x8 engines x 1 GPU"
        assert shown["layout"]["runs"] == RANK0_ONLY
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


def test_a_job_laid_out_over_two_training_nodes_runs_rank_0_on_the_first(
        rl_weaved: tuple[Weaved, Path, Path]) -> None:
    """16 + 16 GPUs on 8-GPU nodes: 2 x 8 ranks over both training nodes, 2 x 8 engines
    on both rollout nodes. The layout names both of each; until gangs exist the runtime
    runs one training process on the first training node (the second gets no phase),
    and the job ends with its solo weights."""
    w, sock, _shm = rl_weaved
    spec = job_spec_toml("wide", iterations=ITERATIONS, seed=5, options=OPTIONS,
                         rollout_gpus=16, train_gpus=16)
    job = call(sock, Op.SUBMIT, spec=spec, source="wide.toml")["job"]
    seen: list[dict[str, Any]] = []
    rows = wait_states(sock, [job], {"COMPLETED", "FAILED"}, 240, seen)
    assert rows[0]["state"] == "COMPLETED", rows
    running = [r["layout"] for r in seen if r["state"] == "RUNNING"]
    assert running, seen
    lay = running[-1]
    assert lay["words"] == "train 2x8 ranks; rollout 2x8 engines x 1 GPU"
    assert [n["node"] for n in lay["train"]["nodes"]] == ["h800-0", "h800-1"]
    assert sorted(n["node"] for n in lay["rollout"]["nodes"]) == ["h20-0", "h20-1"]
    assert lay["runs"] == RANK0_ONLY
    group = next(r["group"] for r in seen if r["group"] is not None)
    trained_on = {s.node for s in w.driver.spans.get(group, [])  # type: ignore[attr-defined]
                  if s.kind is Phase.TRAIN}
    assert trained_on == {"h800-0"}, trained_on
    solo = run_solo(MemberSpec(str(job), seed=5, steps=ITERATIONS, options=OPTIONS))
    live = w.driver.live(job)
    assert live is not None and live["weights_sha256"] == weights_digest(solo.weights)
