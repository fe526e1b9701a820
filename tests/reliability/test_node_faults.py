"""Node-level faults through weaved (issue 8): a member's resident worker killed with
SIGKILL mid-phase, a node daemon killed with SIGKILL, and a job whose warm state is
larger than a node's host-memory budget.

weaved runs in process on the LocalBackend with the group runtime (real node daemons,
real resident workers, real /dev/shm). After each fault: the affected member is
re-admitted from its checkpoint (or ends FAILED with the reason in words), the other
members finish with the weights of their solo runs bit for bit, and ``weave status``
(the ``status`` op) and ``weave show job`` say what happened in words.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import daemons_gone, node_status
from tests.harness.scratch import public_dir, shm_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_config, serving, smoke_site, wait_states
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import Weaved
from weave_slurm.errors import NodeGone
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytestmark = pytest.mark.torch

STEPS = 2
#: The jobs the kills aim at: phases of the toy's default batch (8 prompts x 8 draws),
#: four times :data:`OPTIONS`' rows, so that a probe polling the node daemons sees one
#: running (on a fast machine with warm caches, the small batch's phases ran out between
#: polls and a 4-step job ended unseen)
BUSY = {**OPTIONS, "prompts_per_step": 8, "group_size": 8}


@dataclass
class Rig:
    weaved: Weaved
    socket: Path
    shm: Path
    public: Path

    @property
    def nodes_dir(self) -> Path:
        return self.weaved.config.state_dir.resolve() / "nodes"


def make_rig(site: str | None = None) -> Iterator[Rig]:
    with public_dir("weave-nf-") as public, shm_dir("weave-nf-") as shm:
        site_path = None
        if site is not None:
            site_path = public / "site.toml"
            site_path.write_text(smoke_site(site))
        cfg = rl_config(public, shm, site_path=site_path)
        try:
            with serving(cfg) as w:
                yield Rig(w, cfg.socket, shm, public)
        finally:
            daemons_gone(cfg.state_dir.resolve() / "ckpt", 20)


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from make_rig()


def busy_worker(rig: Rig, job: int, min_version: int) -> tuple[int, str, str]:
    """(pid, node, phase) of ``job``'s resident worker while it runs a phase at
    version >= ``min_version``, read from the node daemons' status."""
    def find() -> tuple[int, str, str] | None:
        live = rig.weaved.driver.live(job)   # kept once the job ended (check_solo)
        if live is not None and live["version"] >= min_version:
            for sock in rig.nodes_dir.glob("node-*.sock"):
                for j in statuses(sock):
                    act = j.get("worker") or {}
                    if j["job"] == str(job) and act.get("state") == "running" \
                            and act.get("pid"):
                        return int(act["pid"]), sock.name[5:-5], str(act.get("phase"))
        (row,) = call(rig.socket, Op.STATUS, jobs=[job])["jobs"]
        assert row["state"] in ("PENDING", "PLACED", "RUNNING"), \
            f"job {job} ended before a phase at v>={min_version} was seen: {row}"
        return None
    return wait_for(find, 180, f"job {job} running a phase at v>={min_version}",  # type: ignore[return-value]
                    interval_s=0.01)


def statuses(sock: Path) -> list[dict[str, Any]]:
    """The jobs the node daemon at ``sock`` reports; none where it does not answer
    (the probe polls again; a daemon that really failed shows in the jobs' recoveries)."""
    try:
        return list(node_status(sock)["jobs"])
    except NodeGone:
        return []


def node_daemon_pid(sock: Path) -> int:
    """The pid of the process listening on a node daemon's socket (from /proc/net/unix)."""
    # the listening socket (flags __SO_ACCEPTCON), not an accepted connection on that path
    inode = next(line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                 if line.endswith(" " + str(sock)) and line.split()[3] == "00010000")
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
            except OSError:
                continue
    raise AssertionError(f"no process listens on {sock}")


def submit(rig: Rig, name: str, seed: int, steps: int = STEPS) -> int:
    spec = job_spec_toml(name, iterations=steps, seed=seed, options=BUSY)
    return int(call(rig.socket, Op.SUBMIT, spec=spec, source=f"{name}.toml")["job"])


def check_solo(rig: Rig, jobs: dict[int, int], steps: int = STEPS,
               options: dict[str, int] = BUSY) -> None:
    """Each job's final weights equal its solo run's (job id -> seed; ``options``: the
    jobs', :data:`BUSY` as :func:`submit` gives them)."""
    for job, seed in jobs.items():
        live = rig.weaved.driver.live(job)
        assert live is not None and live["version"] == steps, live
        solo = run_solo(MemberSpec(str(job), seed=seed, steps=steps, options=options))
        assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"


def check_clean(rig: Rig, ids: list[int]) -> None:
    """The group drained: no allocation, no node daemon or worker, no job segment."""
    wait_for(lambda: not rig.weaved.backend.list_allocations(""), 30, "allocations released")
    assert daemons_gone(rig.weaved.config.state_dir.resolve() / "ckpt", 30)
    assert [p for p in rig.shm.rglob("*") if p.name in {str(j) for j in ids}] == []


def kill_mid_phase(rig: Rig, job: int, min_version: int, tries: int = 3) -> tuple[str, str]:
    """SIGKILL ``job``'s resident worker while it runs a phase; (node, phase).

    A phase can end between the status read and the kill; the daemon then replaces
    the idle worker silently (nothing of the job was lost) and we try the next phase.
    """
    for _ in range(tries):
        pid, node, phase = busy_worker(rig, job, min_version)
        os.kill(pid, signal.SIGKILL)

        moved_on: list[float] = []

        def outcome(pid: int = pid, node: str = node,
                    moved_on: list[float] = moved_on) -> str | None:
            live = rig.weaved.driver.live(job) or {}
            if live.get("recoveries", 0) >= 1:
                return "killed"
            for j in statuses(rig.nodes_dir / f"node-{node}.sock"):
                act = j.get("worker") or {}
                if j["job"] != str(job):
                    continue
                if act.get("pid") == pid:   # "killed" is counted at the executor's poll
                    return {"running": None, "killed": "killed"}.get(
                        str(act.get("state")), "missed")
                # a newer phase runs: the kill hit an idle worker, unless a recovery
                # (counted a moment later) says otherwise
                moved_on.append(time.monotonic())
                return "missed" if moved_on[-1] - moved_on[0] > 5.0 else None
            return None
        if wait_for(outcome, 30, f"the end of worker {pid}'s phase") == "killed":
            return node, phase
    raise AssertionError(f"no kill of job {job}'s worker landed mid-phase in {tries} tries")


def test_worker_killed_mid_phase_is_readmitted(rig: Rig) -> None:
    seeds = {submit(rig, f"wk{i}", 41 + i, steps=4): 41 + i for i in range(2)}
    victim, other = list(seeds)
    node, phase = kill_mid_phase(rig, victim, 1)
    seen: list[dict[str, Any]] = []
    rows = wait_states(rig.socket, list(seeds), {"COMPLETED", "FAILED"}, 240, seen)
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    after = rig.weaved.driver.live(victim)
    assert after is not None and after["recoveries"] >= 1, after
    assert rig.weaved.driver.live(other)["recoveries"] == 0  # type: ignore[index]
    check_solo(rig, seeds, steps=4)
    # in words: which worker, which signal, which phase, re-admitted from which version
    # ("killed by signal 9 (SIGKILL)" when the node daemon already knows the exit status)
    said = [r["reason"] for r in seen if r["job"] == victim]
    words = next((s for s in said if "re-admitted from checkpoint v" in (s or "")), None)
    assert words is not None and f"worker on node {node} killed" in words, said
    assert f"during {phase}" in words and "returncode" not in words, words
    final = call(rig.socket, Op.SHOW, kind="job", id=victim)["reason"]
    assert final.startswith("reached version 4/4 after 1 recovery"), final
    assert f"worker on node {node} killed" in final, final
    check_clean(rig, list(seeds))


@pytest.mark.slow
def test_node_daemon_killed_members_readmitted(rig: Rig) -> None:
    seeds = {submit(rig, f"nd{i}", 51 + i, steps=3): 51 + i for i in range(2)}
    victim = next(iter(seeds))
    _pid, node, _phase = busy_worker(rig, victim, 1)
    sock = rig.nodes_dir / f"node-{node}.sock"
    pid = node_daemon_pid(sock)
    os.kill(pid, signal.SIGKILL)
    seen: list[dict[str, Any]] = []
    rows = wait_states(rig.socket, list(seeds), {"COMPLETED", "FAILED"}, 240, seen)
    states = {r["job"]: r["state"] for r in rows}
    # the node daemon is relaunched by weaved and re-adopts its segments: the members
    # on that node are re-admitted from checkpoint (or, if recovery ran out, FAILED
    # with the reason in words); nothing is left RUNNING and no other job is touched
    said = " | ".join(str(r["reason"]) for r in seen)
    assert "node daemon" in said or "daemon at" in said, said
    done = {j: s for j, s in seeds.items() if states[j] == "COMPLETED"}
    for r in rows:
        if r["state"] == "FAILED":
            assert "node" in r["reason"], r
    assert done, rows
    check_solo(rig, done, steps=3)
    check_clean(rig, list(seeds))


BUDGET_SITE = """\
[site]
name = "tiny-budget"
[pools.rollout]
partition = "h20"
gpu = "h20"
gpus_per_node = 8
host_mem_gib = 0.05
max_nodes = 2
[pools.train]
partition = "h800"
gpu = "h800"
gpus_per_node = 8
host_mem_gib = 0.05
max_nodes = 2
"""


@pytest.fixture
def tiny_rig() -> Iterator[Rig]:
    yield from make_rig(BUDGET_SITE)


def test_state_over_host_memory_budget_fails_only_that_job(tiny_rig: Rig) -> None:
    rig = tiny_rig
    small = job_spec_toml("fits", iterations=2, seed=61, rollout_state_gib=0.001,
                          train_state_gib=0.001, options=OPTIONS)
    # the declared profile fits, the real warm state (~100 MiB) does not fit 0.05 GiB
    big = job_spec_toml("huge", iterations=2, seed=62, rollout_state_gib=0.001,
                        train_state_gib=0.001, options={**OPTIONS, "hidden_size": 512,
                                                        "intermediate_size": 1024,
                                                        "vocab_size": 2048})
    ok = int(call(rig.socket, Op.SUBMIT, spec=small, source="fits.toml")["job"])
    bad = int(call(rig.socket, Op.SUBMIT, spec=big, source="huge.toml")["job"])
    rows = wait_states(rig.socket, [ok, bad], {"COMPLETED", "FAILED"}, 240, [])
    states = {r["job"]: r for r in rows}
    assert states[ok]["state"] == "COMPLETED", rows
    assert states[bad]["state"] == "FAILED", rows
    reason = states[bad]["reason"]
    assert "host_mem_gib" in reason or "budget" in reason, reason
    assert "\n" not in reason
    check_solo(rig, {ok: 61}, steps=2, options=OPTIONS)
    check_clean(rig, [ok, bad])
