"""Faults on the session's Slurm cluster (issue 8; every node a host of its own), with
the group runtime running small reference GRPO jobs. weaved runs on the login side (its
state there only, its checkpoints on the shared root); what the tests look at on a
node (its node daemons, its /dev/shm) they look at on that node's host.

* weaved SIGKILLed mid-run and started again: every job is there exactly once and
  finishes with the weights of its solo run; Slurm's allocations before and after are
  the same ones (adopted, none duplicated) and none is left once the jobs end; no
  job's weight version (ITER) ever goes backwards;
* a node of a group's rollout allocation set DOWN by the admin (``scontrol update
  state=down``, the host still up: Slurm ends the allocation and its steps at once),
  or lost for real (its host's interface down: nothing reaches it until Slurm marks it
  DOWN after SlurmdTimeout): the allocation vanishes, weaved asks Slurm for a
  replacement through the normal allocation path and re-admits the members from their
  checkpoints on it;
* a node of a group's training allocation set DOWN: the members' checkpoints, on the
  shared root, move to the replacement training node;
* a node's slurmd stopped: the node works on, until Slurm gives up on it;
* ``sbatch`` failing, then hanging past its timeout (a wrapper first on weaved's
  PATH): weaved backs off and retries, status says why in words, no job is lost and
  no allocation leaks or doubles; after the fault clears the jobs run to the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import (
    WeavedDirs,
    kill_running_worker,
    kill_until_recovered,
    link_down,
    link_up,
    naming_jobs,
    node_names,
    node_shm,
    node_status,
    on_host,
    shm_paths,
    weaved_dirs,
)
from tests.harness.processes import daemons_gone
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, pings, recoveries
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.fault_points import ENV, EXIT_CODE, FaultPoint
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import WeaveError
from weave_slurm.node.segments import SEG_SUFFIX, weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm import daemons
from weave_slurm.slurm.allocation_watch import ENV_INTERVAL
from weave_slurm.slurm.backend import AllocationState
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.command_runner import run_command
from weave_slurm.slurm.local_cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

STEPS = 3

#: weaved as a separate process (so it can be SIGKILLed), configured from JSON
LAUNCH = """\
import json, logging, sys
from pathlib import Path
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import WeaveError
a = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, format="%(asctime)s weaved %(message)s")
Weaved(DaemonConfig(state_dir=Path(a["state"]), backend="slurm", instance=a["instance"],
                    tick_s=0.3, checkpoint_root=Path(a["ckpt"]), runtime="rl",
                    client_timeout_s=5.0, env=a["env"])).run()
"""


@dataclass
class Place:
    public: Path            # login-side scratch: weaved's log, an sbatch wrapper
    dirs: WeavedDirs        # weaved's state (login side) and checkpoints (shared)
    instance: str
    env: dict[str, str]
    backend: SlurmCliBackend
    cluster: LocalCluster   # the session's (pid files of its slurmds, its hosts)
    seen_iter: dict[int, int] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        return self.dirs.state

    @property
    def socket(self) -> Path:
        return self.state / "weaved.sock"

    @property
    def prefix(self) -> str:
        return f"weave-g{self.instance}."

    def allocations(self) -> dict[str, str]:
        """Slurm's allocations under this daemon's prefix: id -> name (no name twice
        among those pending or running; one ending is being released: an orphan of a
        hung sbatch that weaved cancelled may still be ending beside its replacement)."""
        allocs = self.backend.list_allocations(self.prefix)
        names = Counter(a.name for a in allocs if a.state is not AllocationState.ENDING)
        assert all(n == 1 for n in names.values()), f"duplicate allocations: {allocs}"
        return {a.alloc_id: a.name for a in allocs}


@pytest.fixture
def place(slurm_cluster: SessionCluster) -> Iterator[Place]:
    public = Path(tempfile.mkdtemp(prefix="weave-sf-"))
    public.chmod(0o755)
    env = {**slurm_cluster.env, ENV_INTERVAL: str(WATCH_S)}
    instance = f"sf{os.getpid()}{int(time.time()) % 1000}"
    p = Place(public, weaved_dirs(slurm_cluster.cluster, instance), instance, env,
              SlurmCliBackend(env=env), slurm_cluster.cluster)
    try:
        yield p
    finally:
        for a in p.backend.list_allocations(p.prefix):
            p.backend.release(a.alloc_id)
        daemons_gone(p.dirs.node_ckpt, 20)
        log = public / "weaved.log"
        if log.exists():   # pytest shows it when the test failed
            print("".join(log.read_text(errors="replace").splitlines(True)[-300:]))
        shutil.rmtree(public, ignore_errors=True)
        for node in slurm_cluster.nodes:   # the warm state each host kept
            on_host(p.cluster, node, ["rm", "-rf", str(node_shm(instance, node).parent)])


def spawn(p: Place, fault: FaultPoint | None = None) -> subprocess.Popen[bytes]:
    """weaved as a process of its own (``fault``: it dies as if SIGKILLed at its first
    crossing of that point, daemon/fault_points.py)."""
    args = {"state": str(p.state), "instance": p.instance, "ckpt": str(p.dirs.ckpt),
            "env": p.env}
    env = None if fault is None else {**os.environ, ENV: fault.value}
    log = open(p.public / "weaved.log", "ab")  # noqa: SIM115 (kept by the child)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(args)],
                            stdout=log, stderr=log, env=env)
    log.close()
    wait_for(lambda: pings(p.socket), 60, "weaved answers")
    return proc


def submit(p: Place, name: str, seed: int, steps: int = STEPS) -> int:
    return int(call(p.socket, Op.SUBMIT, spec=job_spec(name, seed, steps),
                    source=f"{name}.toml")["job"])


def observe(p: Place, ids: list[int]) -> list[dict[str, Any]]:
    """One status poll: ITER never goes backwards, allocations never doubled."""
    rows = list(call(p.socket, Op.STATUS, jobs=ids)["jobs"])
    assert sorted(r["job"] for r in rows) == sorted(ids), rows   # each job exactly once
    for r in rows:
        if r["iter"]:
            v = int(r["iter"].split("/")[0])
            assert v >= p.seen_iter.get(r["job"], 0), (r, p.seen_iter)
            p.seen_iter[r["job"]] = v
    p.allocations()
    return rows


def finish(p: Place, ids: list[int], timeout_s: float) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        rows = observe(p, ids)
        return rows if all(r["state"] in ("COMPLETED", "FAILED", "CANCELLED")
                           for r in rows) else None
    return list(wait_for(done, timeout_s, f"jobs {ids} to end"))


def check_solo_digests(p: Place, seeds: dict[int, int], steps: int = STEPS) -> None:
    for job, seed in seeds.items():
        shown = call(p.socket, Op.SHOW, kind="job", id=job)
        solo = run_solo(MemberSpec(str(job), seed=seed, steps=steps, options=OPTIONS))
        assert shown["runtime"]["weights_sha256"] == weights_digest(solo.weights), job


def check_released(p: Place) -> None:
    wait_for(lambda: not p.allocations(), 40, "allocations released")
    assert daemons_gone(p.dirs.node_ckpt, 30)


@pytest.mark.slow
def test_weaved_sigkill_on_slurm_keeps_jobs_and_allocations(place: Place) -> None:
    p = place
    proc = spawn(p)
    try:
        seeds = {submit(p, f"sk{i}", 71 + i): 71 + i for i in range(2)}
        ids = list(seeds)
        wait_for(lambda: all(int((r["iter"] or "0/0").split("/")[0]) >= 1
                             for r in observe(p, ids)), 180, "both jobs at version >= 1")
        before = p.allocations()
        assert sorted(before.values()) == sorted(
            {n for n in before.values()}) and len(before) == 2, before
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert p.allocations() == before   # Slurm keeps them while weaved is dead
        proc = spawn(p, FaultPoint.JOB_ENDED)   # killed again as a job's end is reported

        def killed() -> bool:   # ITER watched to the end (observe): none goes back after
            with contextlib.suppress(WeaveError, OSError):
                observe(p, ids)
            return proc.poll() is not None
        wait_for(killed, 240, "weaved killed as a job's end was reported", interval_s=0.3)
        assert proc.returncode == EXIT_CODE, proc.returncode
        proc = spawn(p)   # each job ended on its nodes, its end not stored: it re-attaches
        rows = finish(p, ids, 240)   # there at its last step, not started afresh
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        assert {r["iter"] for r in rows} == {f"{STEPS}/{STEPS}"}
        for job in ids:   # resumed from a checkpoint, not from scratch
            shown = call(p.socket, Op.SHOW, kind="job", id=job)
            assert shown["runtime"]["recoveries"] >= 1, shown["runtime"]
            assert "re-attached after a weaved restart" in shown["reason"], shown["reason"]
        check_solo_digests(p, seeds)
        check_released(p)
        log = (p.public / "weaved.log").read_text()
        assert "orphan" not in log, log   # the restarted daemon adopted, never re-asked
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def scontrol(env: dict[str, str], *args: str) -> None:
    run_command(["scontrol", "update", *args], env=env, timeout_s=20)


def start_inproc(p: Place, backend: SlurmCliBackend | None = None,
                 immediate_s: int = 10) -> tuple[Weaved, threading.Thread]:
    cfg = DaemonConfig(state_dir=p.state, backend="slurm", instance=p.instance, tick_s=0.3,
                       checkpoint_root=p.dirs.ckpt, runtime=DriverKind.RL,
                       client_timeout_s=5.0, env=p.env, immediate_s=immediate_s)
    w = Weaved(cfg, backend=backend or p.backend)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    wait_for(p.socket.exists, 30, "weaved socket")
    return w, t


def stop_inproc(w: Weaved, t: threading.Thread) -> None:
    """Stop an in-process weaved and wait until its loop has really ended: a tick still
    running (it may wait out a runtime tick, and a call to a node that stopped answering
    takes up to 15 s) could otherwise allocate after the test released everything, and
    the next test would find a node taken."""
    w.stop()
    t.join(timeout=150)
    assert not t.is_alive(), "weaved's loop did not end within 150 s of stop"


def set_down(p: Place, node: str) -> Callable[[], None]:
    """``scontrol update state=down`` (an admin takes the node out; its host stays up);
    the undo resumes it. Its slurmd still answers, so Slurm may give the node back
    within seconds (ReturnToService=2), even to the replacement allocation."""
    scontrol(p.env, f"nodename={node}", "state=down", "reason=weave-fault-test")
    # "resume" is refused when it already returned to service
    return lambda: run_command(["scontrol", "update", f"nodename={node}", "state=resume"],
                               env=p.env, timeout_s=20, check=False)


def set_down_for_repair(p: Place, node: str) -> Callable[[], None]:
    """:func:`set_down`, then drained, as an admin takes a node out for repair: its
    allocations end at once, and Slurm grants it to no one until the undo resumes it
    (a DOWN node that registers again stays DRAIN)."""
    undo = set_down(p, node)
    scontrol(p.env, f"nodename={node}", "state=drain", "reason=weave-fault-test")
    return undo


def back_in_service(p: Place, node: str) -> None:
    """Wait until Slurm has ``node`` back (ReturnToService=2; resumed if it stays DOWN
    or drained)."""
    def back() -> bool:
        out = run_command(["sinfo", "-h", "-n", node, "-o", "%t"], env=p.env,
                          timeout_s=20, check=False).stdout.strip()
        if out.startswith(("down", "drain", "drng")) or out.endswith("*"):
            run_command(["scontrol", "update", f"nodename={node}", "state=resume"],
                        env=p.env, timeout_s=20, check=False)
            return False
        return bool(out)
    wait_for(back, 120, f"{node} back in service")


#: The node daemons' allocation watch, short here (weaved's steps inherit its env).
WATCH_S = 5
#: How long after the link is back the lost allocation's node daemon has to end itself.
ORPHAN_GONE_S = 90


def cut_link(p: Place, node: str) -> Callable[[], None]:
    """The node's host drops off the network (its interface down): slurmctld, weaved
    and the other nodes reach it no more, its processes run on; after SlurmdTimeout
    Slurm marks it DOWN and ends its jobs. The undo brings the link back, waits until
    Slurm has the node back and the lost allocation's node daemon there has ended
    itself (its allocation watch: B2, F17); what a site's health check would still
    have to end fails the test (it is ended all the same)."""
    link_down(p.cluster, node)

    def undo() -> None:
        # asked on the host itself (its node-local socket): is the lost allocation's
        # node daemon still there, or did its slurmstepd end it while the host was cut
        # off (the step's srun connection broken; seen in 1 of 6 runs)?
        stale = node_status(p.cluster, node, p.instance) is not None
        link_up(p.cluster, node)
        up = time.monotonic()
        back_in_service(p, node)
        back = time.monotonic() - up
        settle(lambda: not orphan_steps(p, node)
               and node_status(p.cluster, node, p.instance) is None,
               ORPHAN_GONE_S, interval_s=0.5)
        gone = time.monotonic() - up
        left = orphan_steps(p, node)
        ended = end_orphan_steps(p, node)
        segments = [q for q in shm_paths(p.cluster, node, node_shm(p.instance, node))
                    if q.endswith(SEG_SUFFIX)]
        print(f"cut-off {node}: node daemon {'still' if stale else 'no longer'} there at "
              f"the return; back in service {back:.1f} s after the link came up; stale "
              f"steps gone {gone:.1f} s after it; left for the health check: {left}; "
              f"segments left: {len(segments)}", flush=True)
        assert not ended, (f"{node}: the lost allocation's steps outlived its return by "
                           f"{ORPHAN_GONE_S} s and had to be killed: {left}")
        if stale:   # ended once Slurm could say its job ended: segments removed first
            assert not segments, f"{node}: the lost allocation's warm state is left: " \
                                 f"{segments}"
    return undo


def orphan_steps(p: Place, node: str) -> dict[int, str]:
    """On ``node``'s host, the processes of this cluster's jobs that Slurm no longer
    runs: pid -> command line."""
    running = set(run_command(["squeue", "-h", "-o", "%i"], env=p.env,
                              timeout_s=20).stdout.split())
    net = next(a.split("=", 1)[1] for a in p.cluster.host_argv(node, ["true"])
               if a.startswith("--net="))
    host_ns = os.stat(net).st_ino
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in
                       (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in kv)
            same_host = os.stat(entry / "ns" / "net").st_ino == host_ns
        except OSError:
            continue
        job = env.get("SLURM_JOB_ID")
        if (same_host and job is not None and job not in running
                and env.get("SLURM_CONF") == p.env["SLURM_CONF"]):
            with contextlib.suppress(OSError):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace").strip()
    return found


def end_orphan_steps(p: Place, node: str) -> list[int]:
    """What a site's node health check does after an outage: end, on ``node``'s host,
    the processes of this cluster's jobs that Slurm no longer runs (their pids).

    Slurm takes a host that was cut off back once it answers a ping, and ended its jobs
    meanwhile, but nobody tells the host: before F17 the steps of the lost allocation
    (its node daemon) ran on there; neither a resume, ``scontrol reconfigure`` nor a
    restarted slurmd (which registers with the steps it finds) ended them within a
    minute (docs/reliability.md, B2). Now the node daemon ends itself."""
    ended = []
    for pid in orphan_steps(p, node):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    return ended


def stop_slurmd(p: Place, node: str) -> Callable[[], None]:
    """SIGSTOP the node's slurmd (its steps keep running, Slurm cannot reach it: after
    SlurmdTimeout it marks the node DOWN); the undo continues it and waits until
    Slurm has the node back (ReturnToService=2), its stale steps killed."""
    rec = daemons.read(p.cluster.paths.pid_file(f"slurmd-{node}"))
    assert rec is not None and daemons.is_alive(rec), f"no slurmd of {node}"
    os.kill(rec.pid, signal.SIGSTOP)   # one pid namespace: the host's slurmd is visible

    def undo() -> None:
        os.kill(rec.pid, signal.SIGCONT)
        back_in_service(p, node)
    return undo


def node_down(p: Place, role: str, name: str, seed: int,
              fault: Callable[[Place, str], Callable[[], None]] = set_down,
              replace_s: float = 60, steps: int = STEPS, cancel: bool = False
              ) -> tuple[dict[str, Any], list[dict[str, Any]], str, dict[int, int]]:
    """Two jobs in one group; once both are at version >= 1 the first node of the
    group's ``role`` allocation gets ``fault`` (default: set DOWN). Waits for a
    replacement allocation (then undoes the fault) and the jobs' end, checks they
    COMPLETED with their solo runs' weights and nothing is left. ``cancel``: once both
    made progress on the new allocation they are cancelled instead (for jobs run with
    many steps, so that they outlive a slow fault) and must end CANCELLED.
    (lost allocation, status rows seen meanwhile, the node, job -> seed)."""
    w, t = start_inproc(p)
    undo: Callable[[], None] | None = None
    try:
        seeds = {submit(p, f"{name}{i}", seed + i, steps): seed + i for i in range(2)}
        ids = list(seeds)
        wait_for(lambda: all(int((r["iter"] or "0/0").split("/")[0]) >= 1
                             for r in observe(p, ids)), 180, "both jobs at version >= 1")
        (group,) = call(p.socket, Op.GROUPS)["groups"]
        alloc = next(a for a in group["allocations"] if a["role"] == role)
        down = str(alloc["nodes"][0])
        undo = fault(p, down)
        seen: list[dict[str, Any]] = []

        def replaced() -> bool:
            seen.extend(observe(p, ids))
            groups = call(p.socket, Op.GROUPS)["groups"]
            return any(a["role"] == role and a["state"] == "HELD" and a["id"] != alloc["id"]
                       for g in groups for a in g["allocations"])
        wait_for(replaced, replace_s, f"a replacement {role} allocation")
        undo, undone = None, undo
        undone()
        if cancel:
            at = {r["job"]: int((r["iter"] or "0/0").split("/")[0]) for r in observe(p, ids)}

            def progressed() -> bool:
                rows = observe(p, ids)
                seen.extend(rows)
                return all(r["iter"] and int(r["iter"].split("/")[0]) > at[r["job"]]
                           for r in rows)
            wait_for(progressed, 240, "both jobs training on the new allocation")
            assert all(r["ok"] for r in call(p.socket, Op.CANCEL, jobs=ids)["results"])
            rows = finish(p, ids, 120)
            assert [r["state"] for r in rows] == ["CANCELLED", "CANCELLED"], rows
            check_replaced(p, group["group"])
            check_released(p)
            return alloc, seen, down, seeds
        rows = finish(p, ids, 240)
        seen.extend(rows)
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        for job in ids:
            # the final reason says how it ended (after a recovery it also names the
            # fault, unless the re-admission came through a fresh join on the new node)
            shown = call(p.socket, Op.SHOW, kind="job", id=job)
            assert shown["reason"].startswith("reached version"), shown["reason"]
        check_replaced(p, group["group"])
        check_solo_digests(p, seeds, steps)
        check_released(p)
        return alloc, seen, down, seeds
    finally:
        stop_inproc(w, t)
        if undo is not None:
            undo()


def check_replaced(p: Place, group: int) -> None:
    """The group went FORMING for a replacement (its reason names the lost allocation
    where it was LOST before the replacement was asked: not always, 1 of 2 set-down
    runs)."""
    transitions = call(p.socket, Op.SHOW, kind="group", id=group)["transitions"]
    assert any(x["dst"] == "FORMING" for x in transitions), transitions


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cut-off", "set-down"])
def test_rollout_node_down_reprovisions_and_readmits(place: Place, how: str) -> None:
    """``cut-off``: the rollout node's host is cut off the network (lost for real):
    weaved loses its node daemon at once, Slurm the node after SlurmdTimeout (30 s,
    about 45 s in all here). ``set-down``: the admin sets it DOWN; Slurm ends the
    allocation and its steps at once, while the host is up."""
    fault, replace_s = (cut_link, 180) if how == "cut-off" else (set_down, 60)
    alloc, seen, _, _ = node_down(place, "rollout", "dn", 81, fault=fault,
                                  replace_s=replace_s)
    said = " | ".join(str(r["reason"]) for r in seen)
    # weaved's own reason, or the runtime's account of the same fault (whichever the
    # poll caught first); show group keeps weaved's (check_replaced)
    assert (f"rollout allocation {alloc['id']}" in said or "rollout node" in said), said


@pytest.mark.slow
def test_stopped_slurmd_node_is_replaced_and_its_members_readmitted(place: Place) -> None:
    """A stopped slurmd: the node daemon and workers on it keep running (the jobs go on
    there), until Slurm marks the node DOWN after SlurmdTimeout (30 s, about 45 s in
    all here) and ends the allocation; weaved treats it as the lost allocation it is.
    The jobs would run 100,000 steps, so that they are still running when Slurm gives
    up; once both trained further on the new allocation they are cancelled (the
    node-down tests compare the weights with solo runs on the same recovery path)."""
    _, seen, _, _ = node_down(place, "rollout", "sd", 75, fault=stop_slurmd,
                              replace_s=180, steps=100_000, cancel=True)
    said = " | ".join(str(r["reason"]) for r in seen)
    assert "re-admitted" in said, said   # and weaved's account: check_replaced


@pytest.mark.slow
def test_training_node_down_moves_its_checkpoints_and_readmits(place: Place) -> None:
    """The training node holds the warm train state; its checkpoints are on the file
    system weaved shares with the nodes, so the members are re-admitted on the
    replacement training node from there and end with their solo weights. The node is
    set DOWN and drained by the admin: Slurm ends the allocation at once while the host
    is up (its node daemon is told to stop, not cut off), and the replacement is on the
    other training host (set DOWN alone, the node may come back within seconds and be
    the replacement: its checkpoints then stay where they are, ``_move_checkpoint``)."""
    _, seen, down, seeds = node_down(place, "train", "tn", 85, fault=set_down_for_repair)
    said = " | ".join(str(r["reason"]) for r in seen)
    assert "from its last checkpoint" in said, said   # weaved's: check_replaced
    lost_root = place.dirs.node_ckpt / down   # on the shared root
    assert not [q for q in lost_root.rglob("*") if q.name in {str(j) for j in seeds}]


SBATCH_WRAPPER = """\
#!/bin/sh
# weave fault test: the first {fail} calls fail, the next {hang} are queued but hang
n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}
if [ $n -le {fail} ]; then
  echo "sbatch: error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
if [ $n -le {total} ]; then {real} "$@"; sleep 60; fi
exec {real} "$@"
"""


def test_sbatch_failing_then_hanging_is_retried(place: Place) -> None:
    p = place
    real = shutil.which("sbatch")
    assert real is not None
    wrap = p.public / "bin"
    wrap.mkdir()
    count = p.public / "sbatch.count"
    (wrap / "sbatch").write_text(SBATCH_WRAPPER.format(fail=2, hang=1, total=3, count=count,
                                                       real=real))
    (wrap / "sbatch").chmod(0o755)
    env = {**p.env, "PATH": f"{wrap}:{os.environ['PATH']}"}
    backend = SlurmCliBackend(env=env, timeout_s=5.0)
    w, t = start_inproc(p, backend=backend, immediate_s=1)
    try:
        seeds = {submit(p, f"sa{i}", 91 + i, 2): 91 + i for i in range(2)}
        ids = list(seeds)
        seen: list[dict[str, Any]] = []
        def running() -> bool:
            rows = observe(p, ids)
            seen.extend(rows)
            return all(x["state"] == "RUNNING" for x in rows)
        wait_for(running, 120, "both running")
        said = " | ".join(str(r["reason"]) for r in seen)
        assert "Unable to contact slurm controller" in said and "retrying in" in said, said
        assert "sbatch hung: command timed out after" in said, said
        assert int(count.read_text()) >= 4   # 2 failures, 1 hang, then started
        rows = finish(p, ids, 240)
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        check_solo_digests(p, seeds, steps=2)
        check_released(p)
    finally:
        stop_inproc(w, t)


def group_nodes(p: Place) -> set[str]:
    """The nodes of this weaved's groups' allocations."""
    return {str(n) for g in call(p.socket, Op.GROUPS)["groups"] for a in g["allocations"]
            for n in a["nodes"]}


def _workers(p: Place, job: int) -> dict[str, dict[str, Any]]:
    """``job``'s resident worker per node, from the node daemons' own status, asked on
    each node's host."""
    out = {}
    for node in sorted(group_nodes(p)):
        status = node_status(p.cluster, node, p.instance)
        for j in status["jobs"] if status else ():
            if j["job"] == str(job):
                out[node] = {"resident": j.get("resident") or {},
                             "worker": j.get("worker") or {}}
    return out


def kill_mid_phase(p: Place, job: int, ids: list[int], tries: int = 4) -> None:
    """SIGKILL ``job``'s worker while it runs a phase, once the job is at version >= 1.

    The kill comes from the host of one of its nodes (training and rollout in turn), a
    few ms after that node daemon said the phase runs: asked from the login side, the
    toy's phase (a tenth of a second) is mostly over before the kill lands. A phase may
    still end first; the daemon then replaces the idle worker silently and we try the
    next one. A kill landed when the job counts a recovery.
    """
    def version() -> int:
        row = next(r for r in observe(p, ids) if r["job"] == job)
        return int((row["iter"] or "0/0").split("/")[0])
    wait_for(version, 240, f"job {job} at version >= 1", until=lambda v: v >= 1)
    (group,) = call(p.socket, Op.GROUPS)["groups"]
    nodes = [str(a["nodes"][0]) for role in ("train", "rollout")
             for a in group["allocations"] if a["role"] == role]
    turn = iter(range(tries))

    def kill() -> dict[str, Any] | None:
        row = next(r for r in observe(p, ids) if r["job"] == job)
        assert row["state"] == "RUNNING", f"job {job} ended before a kill landed: {row}"
        return kill_running_worker(p.cluster, nodes[next(turn) % len(nodes)], p.instance,
                                   job)

    def count() -> int:
        observe(p, ids)
        return recoveries(p.socket, job)
    kill_until_recovered(kill, count, tries)


@pytest.mark.slow
def test_worker_killed_and_job_cancelled_mid_rollout_on_slurm(place: Place) -> None:
    """Issue 7's acceptance on Slurm: one member's worker SIGKILLed mid-phase is
    re-admitted from its checkpoint and finishes with its solo weights; a member
    cancelled mid-rollout leaves no worker process and no shared memory; the third
    finishes with its solo weights."""
    steps = {0: 16, 1: 40, 2: 4}
    proc = spawn(place)
    try:
        # the one to kill runs long enough for several tries (a toy phase is a tenth of
        # a second: a kill may land just after it, and the job must still be running
        # for the next); the one to cancel runs longer, so that it is still rolling out
        # when we get to it
        seeds = {submit(place, f"k{i}", 51 + i, steps[i]): 51 + i for i in range(3)}
        victim, cancelled, bystander = list(seeds)
        kill_mid_phase(place, victim, list(seeds))

        # watched on its rollout node's host (a rollout is a tenth of a second: a poll
        # from here, a process per node, misses most of them on a loaded machine)
        (group,) = call(place.socket, Op.GROUPS)["groups"]
        (rollout,) = [str(a["nodes"][0]) for a in group["allocations"]
                      if a["role"] == "rollout"]
        rolling = kill_running_worker(place.cluster, rollout, place.instance, cancelled,
                                      timeout_s=240, phase="rollout", watch=True)
        assert rolling, (f"job {cancelled} never ran a rollout on {rollout}: "
                         f"{observe(place, list(seeds))}")
        pids = {int(w["resident"]["pid"]) for w in _workers(place, cancelled).values()
                if w["resident"].get("pid")}
        assert pids, "no resident worker of the cancelled job found"
        assert call(place.socket, Op.CANCEL, jobs=[cancelled])["results"][0]["ok"]

        rows = finish(place, list(seeds), 360)
        states = {r["job"]: r["state"] for r in rows}
        assert states == {victim: "COMPLETED", cancelled: "CANCELLED",
                          bystander: "COMPLETED"}, rows
        check_solo_digests(place, {victim: seeds[victim]}, steps[0])
        check_solo_digests(place, {bystander: seeds[bystander]}, steps[2])
        reason = call(place.socket, Op.SHOW, kind="job", id=victim)["reason"]
        assert "recover" in reason and "killed" in reason, reason
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 30,
                 "the cancelled job's workers gone")
        assert not _workers(place, cancelled)
        for node in node_names(place.cluster):   # nothing of it in any host's /dev/shm
            left = shm_paths(place.cluster, node, node_shm(place.instance, node))
            assert naming_jobs(left, [cancelled]) == [], (node, left)
        check_released(place)
    finally:
        proc.terminate()
        proc.wait(30)
