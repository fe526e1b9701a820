"""The chaos scenario (issue 33, item 3): every fault of the reliability suite at once,
on one Slurm cluster of separate hosts, with small reference GRPO jobs.

While root's jobs train, the rollout node of a running group is set DOWN (``scontrol
update state=down``) and weaved (a separate process) SIGKILLed and started again on the
same state dir at once; with the node still DOWN the slurmd of another group's training
node is stopped (SIGSTOP, shorter than SlurmdTimeout) and continued; then weaved is
killed again, ``kills`` times in all. Meanwhile a second, unprivileged user floods
weaved with held-open connections, pings and job submissions, bounded by the site's
``[limits.user]`` and ordered by ``[fairshare]``.
A third user (quiet) submits one job right after the flood.

:func:`run_chaos` returns what it saw (:class:`ChaosReport`); the test
(``test_chaos.py``) asserts on it and ``bench/chaos.py`` prints and stores it. It
checks on the way that no job is listed twice and no ITER goes backwards
(``test_slurm_faults.observe``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.harness.hosts import node_names, node_shm, on_host, shm_paths, weaved_dirs
from tests.harness.processes import daemons_gone
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, pings
from tests.reliability.conftest import TestUser
from tests.reliability.test_multiuser import as_user
from tests.reliability.test_slurm_faults import WATCH_S, Place, set_down, stop_slurmd
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import ServerBusy, WeaveError
from weave_slurm.node.segments import SEG_SUFFIX, weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.allocation_watch import ENV_INTERVAL
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.local_cluster import LocalCluster

FINAL = ("COMPLETED", "FAILED", "CANCELLED")
#: weaved as a separate process (so it can be SIGKILLed) with a site file.
LAUNCH = """\
import json, logging, sys
from pathlib import Path
from weave_slurm.daemon.service import DaemonConfig, Weaved
a = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, format="%(asctime)s weaved %(message)s")
Weaved(DaemonConfig(state_dir=Path(a["state"]), backend="slurm", instance=a["instance"],
                    tick_s=0.3, checkpoint_root=Path(a["ckpt"]), runtime="rl",
                    client_timeout_s=5.0, env=a["env"], site_path=Path(a["site"]))).run()
"""
#: The session cluster's pools (2 + 2 nodes of 8 GPUs), two members a group at most
#: (so that 4 jobs fill it and the rest queue), fair share and per-user limits.
SITE = """\
[site]
name = "chaos"
[pools.rollout]
partition = "h20"
gpu = "h20"
gpus_per_node = 8
max_nodes = 2
[pools.train]
partition = "h800"
gpu = "h800"
gpus_per_node = 8
max_nodes = 2
[limits]
max_group_size = 2
[limits.user]
max_running = {max_running}
max_pending = {max_pending}
[fairshare]
half_life_h = 1
[runtime]
gangs = false
"""


@dataclass(frozen=True)
class ChaosPlan:
    kills: int = 3             # weaved SIGKILLs, a few seconds apart
    root_jobs: int = 2         # the first user's (root's) jobs
    root_steps: int = 3
    flood_jobs: int = 8        # the flooding user's submissions (most are refused)
    flood_steps: int = 1
    flood_pings: int = 100
    flood_conns: int = 30      # held open while it submits
    quiet_steps: int = 2       # the quiet user's one job
    max_running: int = 2       # [limits.user]
    max_pending: int = 3
    slurmd_stop_s: float = 10  # below SlurmdTimeout (30 s): Slurm does not give up on the node
    timeout_s: float = 420     # for every job to end


@dataclass
class Kill:
    at_s: float                # since the scenario's start
    answer_s: float = 0.0      # until the restarted weaved answered
    progress_s: float = 0.0    # until some job's ITER moved again


@dataclass
class ChaosReport:
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> final row
    owners: dict[int, str] = field(default_factory=dict)           # id -> root/flood/quiet
    seeds: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (seed, steps)
    kills: list[Kill] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)        # accepted, not listed
    duplicated: list[str] = field(default_factory=list)  # listed more than once
    iter_back: list[str] = field(default_factory=list)   # restarts from an older version
    refused: list[str] = field(default_factory=list)     # the flood's refusals
    conn_refused: list[str] = field(default_factory=list)  # ... while it held connections
    flood_errors: list[str] = field(default_factory=list)
    pending_at_quiet: list[int] = field(default_factory=list)  # flood jobs queued then
    placed_s: dict[int, float] = field(default_factory=dict)   # id -> placed - submitted
    placed_ts: dict[int, float] = field(default_factory=dict)  # id -> wall time of PLACED
    digests_equal: dict[int, bool] = field(default_factory=dict)
    zombies: list[str] = field(default_factory=list)
    processes_left: bool = False
    segments_left: dict[str, list[str]] = field(default_factory=dict)
    shm_left: dict[str, list[str]] = field(default_factory=dict)  # a job's other files
    down_node: str = ""
    stopped_slurmd: str = ""
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["jobs"] = {str(k): v for k, v in self.jobs.items()}
        return out


# -- the place: weaved's dirs on the cluster, cleaned up at the end ----------------------


@contextmanager
def chaos_place(cluster: LocalCluster, env: dict[str, str],
                show_log: bool = True) -> Iterator[Place]:
    """A :class:`Place` (test_slurm_faults) for one weaved on ``cluster``; at the end its
    allocations are released and its node daemons and warm state gone (and the tail of
    weaved's log printed, which pytest shows for a failed test)."""
    public = Path(tempfile.mkdtemp(prefix="weave-chaos-"))
    public.chmod(0o755)
    env = {**env, ENV_INTERVAL: str(WATCH_S)}
    instance = f"ch{os.getpid()}{int(time.time()) % 1000}"
    # weaved's state where the other users reach its socket (login side still)
    dirs = replace(weaved_dirs(cluster, instance), state=public / "state")
    p = Place(public, dirs, instance, env, SlurmCliBackend(env=env), cluster)
    try:
        with traversable(dirs.ckpt):
            yield p
    finally:
        for a in p.backend.list_allocations(p.prefix):
            p.backend.release(a.alloc_id)
        daemons_gone(p.dirs.node_ckpt, 20)
        log = public / "weaved.log"
        if show_log and log.exists():
            print("".join(log.read_text(errors="replace").splitlines(True)[-200:]))
        shutil.rmtree(public, ignore_errors=True)
        for node in node_names(cluster):
            on_host(cluster, node, ["rm", "-rf", str(node_shm(instance, node).parent)])


@contextmanager
def traversable(path: Path) -> Iterator[None]:
    """Every ancestor of ``path`` traversable by other uids (o+x) while inside: the
    other users' workers keep their checkpoints under it (pytest's tmp dirs are 0700)."""
    changed = []
    for d in reversed(path.resolve().parents):
        mode = stat.S_IMODE(d.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(d, mode | stat.S_IXOTH)
            changed.append((d, mode))
    try:
        yield
    finally:
        for d, mode in changed:
            os.chmod(d, mode)


def spawn(p: Place, site: Path) -> subprocess.Popen[bytes]:
    args = {"state": str(p.state), "instance": p.instance, "ckpt": str(p.dirs.ckpt),
            "env": p.env, "site": str(site)}
    with open(p.public / "weaved.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(args)],
                                stdout=log, stderr=log)
    wait_for(lambda: pings(p.socket), 60, "weaved answers")
    return proc


# -- the watch: every poll checks that no job is listed twice or goes back ---------------


@dataclass
class Watch:
    p: Place
    names: dict[str, int] = field(default_factory=dict)   # accepted: name -> id
    maybe: set[str] = field(default_factory=set)          # submit reply lost
    iters: dict[int, int] = field(default_factory=dict)
    duplicated: set[str] = field(default_factory=set)
    went_back: list[str] = field(default_factory=list)
    progressed: int = 0                                   # ITER steps forward seen
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rows(self) -> list[dict[str, Any]]:
        rows = list(call(self.p.socket, Op.STATUS, all=True)["jobs"])
        ids = Counter(r["job"] for r in rows)
        names = Counter(r["name"] for r in rows)
        with self.lock:
            self.duplicated |= {f"job {j}" for j, n in ids.items() if n > 1}
            self.duplicated |= {f"name {x}" for x, n in names.items() if n > 1}
            for r in rows:   # no ITER while a group re-forms: nothing to compare
                if not r["iter"]:
                    continue
                v = int(r["iter"].split("/")[0])
                if v < self.iters.get(r["job"], 0):   # restarted from an older checkpoint
                    self.went_back.append(f"job {r['job']}: {self.iters[r['job']]} -> {v}")
                self.progressed += max(0, v - self.iters.get(r["job"], 0))
                self.iters[r["job"]] = v
        self.p.allocations()   # asserts no allocation twice
        return rows

    def progress(self) -> int:
        return self.progressed


def _rows_or_none(w: Watch) -> list[dict[str, Any]] | None:
    try:
        return w.rows()
    except WeaveError:
        return None


# -- the second user's flood ------------------------------------------------------------


def flood(sock: Path, plan: ChaosPlan) -> dict[str, Any]:
    """In the flooding user's forked child: hold ``flood_conns`` connections open and try
    to submit meanwhile (weaved serves at most 16 of one user's); then submit and ping
    as fast as it can. {"accepted": {name: id}, "refused": [msg], "conn_refused": [msg],
    "errors": {name: msg}}."""
    out: dict[str, Any] = {"accepted": {}, "refused": [], "conn_refused": [], "errors": {}}
    held = []
    for _ in range(plan.flood_conns):
        s = socket.socket(socket.AF_UNIX)
        with contextlib.suppress(OSError):
            s.connect(str(sock))
        held.append(s)
    try:
        call(sock, Op.SUBMIT, spec=job_spec("flood-held", 199, plan.flood_steps),
             source="flood-held")
        out["errors"]["flood-held"] = "taken while the user held its connections"
    except WeaveError as exc:
        out["conn_refused"].append(str(exc))
    for s in held:
        s.close()
    for i in range(plan.flood_jobs):
        name = f"flood{i}"
        try:
            out["accepted"][name] = _submit_busy(sock, job_spec(name, 200 + i,
                                                                 plan.flood_steps), name)
        except WeaveError as exc:
            if "limits.user" in str(exc):
                out["refused"].append(str(exc))
            else:
                out["errors"][name] = str(exc)
    for _ in range(plan.flood_pings):
        with contextlib.suppress(WeaveError, OSError):
            call(sock, Op.PING)
    return out


def _submit_busy(sock: Path, spec: str, name: str, patience_s: float = 30) -> Any:
    """Submit, again while weaved says it is busy (ServerBusy): it frees the connections
    the flood held as it reads their ends, later on a loaded machine."""
    end = time.monotonic() + patience_s
    while True:
        try:
            return call(sock, Op.SUBMIT, spec=spec, source=name)["job"]
        except ServerBusy:
            if time.monotonic() >= end:
                raise
            time.sleep(0.2)


# -- the scenario -----------------------------------------------------------------------


def run_chaos(p: Place, flooder: TestUser, quiet: TestUser,
              plan: ChaosPlan = ChaosPlan()) -> ChaosReport:
    """Run the scenario on ``p`` (module doc); weaved is stopped at the end."""
    site = p.public / "site.toml"
    site.write_text(SITE.format(max_running=plan.max_running, max_pending=plan.max_pending))
    rep, watch, t0 = ChaosReport(), Watch(p), time.monotonic()
    proc = spawn(p, site)
    undo: list[Callable[[], None]] = []
    try:
        for i in range(plan.root_jobs):
            job = int(call(p.socket, Op.SUBMIT, spec=job_spec(f"root{i}", 71 + i,
                                                             plan.root_steps))["job"])
            watch.names[f"root{i}"] = job
            rep.owners[job], rep.seeds[job] = "root", (71 + i, plan.root_steps)
        flooded: dict[str, Any] = {}
        flooder_t = threading.Thread(
            target=lambda: flooded.update(as_user(flooder, lambda: flood(p.socket, plan))))
        flooder_t.start()
        # the quiet user's job once the flood has filled its share (its running limit
        # reached, a job of it queued)
        def flood_queued() -> bool:
            mine = Counter(r["state"] for r in _rows_or_none(watch) or []
                           if r["user"] == flooder.name)
            return mine["PENDING"] >= 1 and mine["PLACED"] + mine["RUNNING"] >= \
                plan.max_running
        wait_for(flood_queued, 90, "a flood job queued behind the flood's running ones",
                 interval_s=0.2)
        quiet_job = _submit_quiet(p, quiet, flooder, plan, watch, rep)
        # once a job trained: the first running group's rollout node goes DOWN and
        # weaved is killed at once, while the flood pings
        wait_for(lambda: any(int((r["iter"] or "0/0").split("/")[0]) >= 1
                             for r in _rows_or_none(watch) or []), 180, "a job at v >= 1")
        groups = [{a["role"]: str(a["nodes"][0]) for a in g["allocations"]}
                  for g in call(p.socket, Op.GROUPS)["groups"]
                  if all(a["state"] == "HELD" for a in g["allocations"])]
        rep.down_node, rep.stopped_slurmd = groups[0]["rollout"], groups[-1]["train"]
        undo.append(set_down(p, rep.down_node))
        proc = _kill_and_restart(p, proc, site, watch, rep, t0)
        flooder_t.join(timeout=120)
        _take_flood(flooded, watch, rep)
        while len(rep.kills) < plan.kills - 1:   # again, the node still DOWN
            _poll_for(watch, 5)
            proc = _kill_and_restart(p, proc, site, watch, rep, t0)
        # then the last group's training node's slurmd stops; not across a kill: a
        # restarted weaved relaunches each group's sync agents as steps, and a member
        # in its first phase whose step cannot start there FAILS (docs/reliability.md,
        # "found by the chaos test")
        undo.append(stop_slurmd(p, rep.stopped_slurmd))
        _poll_for(watch, plan.slurmd_stop_s)
        undo.pop()()       # SIGCONT, and wait until Slurm has the node back
        undo.pop()()       # the DOWN node resumed
        if len(rep.kills) < plan.kills:
            proc = _kill_and_restart(p, proc, site, watch, rep, t0)
        _finish(p, watch, rep, plan, quiet_job)
        rep.zombies = _zombies(proc)
    finally:
        for u in undo:
            u()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    _leftovers(p, rep)
    rep.wall_s = time.monotonic() - t0
    return rep


def _poll_for(watch: Watch, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _rows_or_none(watch)
        time.sleep(0.5)


def _kill_and_restart(p: Place, proc: subprocess.Popen[bytes], site: Path, watch: Watch,
                      rep: ChaosReport, t0: float) -> subprocess.Popen[bytes]:
    before = watch.progress()
    kill = Kill(time.monotonic() - t0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc = spawn(p, site)
    kill.answer_s = time.monotonic() - t0 - kill.at_s
    def moved() -> bool | list[tuple[Any, ...]]:
        """True once it moved; else what weaved says of each job (the failure's words)."""
        rows = _rows_or_none(watch)
        if watch.progress() > before or (bool(rows) and all(
                r["state"] in FINAL for r in rows or [])):
            return True
        return [(r["job"], r["state"], r["iter"], r["reason"]) for r in rows or []]
    wait_for(moved, 120, "a job's ITER moving again after the kill (or every job ended)",
             interval_s=0.3, until=lambda v: v is True)
    kill.progress_s = time.monotonic() - t0 - kill.at_s
    rep.kills.append(kill)
    return proc


def _take_flood(flooded: dict[str, Any], watch: Watch, rep: ChaosReport) -> None:
    assert "ok" in flooded, f"the flooding user's child failed: {flooded}"
    got = flooded["ok"]
    rep.refused = list(got["refused"])
    rep.conn_refused = list(got["conn_refused"])
    rep.flood_errors = [f"{n}: {m}" for n, m in got["errors"].items()]
    watch.maybe |= set(got["errors"])   # a reply lost to a kill: stored or not
    for name, job in got["accepted"].items():
        watch.names[name] = int(job)
        rep.owners[int(job)] = "flood"
        rep.seeds[int(job)] = (200 + int(name[len("flood"):]), 0)


def _submit_quiet(p: Place, quiet: TestUser, flooder: TestUser, plan: ChaosPlan,
                  watch: Watch, rep: ChaosReport) -> int:
    """The quiet user's job, right after the flood; which flood jobs queue then."""
    spec = job_spec("quiet0", 91, plan.quiet_steps)
    sub = as_user(quiet, lambda: call(p.socket, Op.SUBMIT, spec=spec, source="quiet0"))
    assert "ok" in sub, sub
    job = int(sub["ok"]["job"])
    watch.names["quiet0"] = job
    rep.owners[job], rep.seeds[job] = "quiet", (91, plan.quiet_steps)
    rows = wait_for(lambda: _rows_or_none(watch), 60, "weaved answering") or []
    rep.pending_at_quiet = [r["job"] for r in rows
                            if r["user"] == flooder.name and r["state"] == "PENDING"]
    return job


def _finish(p: Place, watch: Watch, rep: ChaosReport, plan: ChaosPlan, quiet: int) -> None:
    """Wait for every job to end; lost and duplicated jobs; PLACED times; digests."""
    def ended() -> list[dict[str, Any]] | None:
        rows = _rows_or_none(watch)
        return rows if rows and all(r["state"] in FINAL for r in rows) else None
    rows = wait_for(ended, plan.timeout_s, "every job ended", interval_s=1.0) or []
    by_name: dict[str, list[int]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r["job"])
        rep.jobs[r["job"]] = r
    for name in watch.maybe:   # stored once or not at all
        if len(by_name.get(name, [])) == 1:
            watch.names[name] = by_name[name][0]
            rep.owners[by_name[name][0]] = "flood"
            rep.seeds[by_name[name][0]] = (200 + int(name[len("flood"):]), 0)
    rep.lost = [f"{n} ({j})" for n, j in watch.names.items() if j not in rep.jobs]
    rep.duplicated = sorted(watch.duplicated)
    rep.iter_back = list(watch.went_back)
    for job in rep.jobs:
        shown = call(p.socket, Op.SHOW, kind="job", id=job)
        trans = shown["transitions"]
        placed = next((t["ts"] for t in trans if t["dst"] == "PLACED"), None)
        if placed is not None:
            rep.placed_ts[job] = float(placed)
            rep.placed_s[job] = float(placed) - float(trans[0]["ts"])
        if rep.jobs[job]["state"] == "COMPLETED" and job in rep.seeds:
            seed, steps = rep.seeds[job]
            steps = steps or plan.flood_steps
            solo = run_solo(MemberSpec(str(job), seed=seed, steps=steps, options=OPTIONS))
            rep.digests_equal[job] = shown["weights_sha256"] == weights_digest(solo.weights)
    wait_for(lambda: not p.allocations(), 60, "allocations released")


def _zombies(proc: subprocess.Popen[bytes]) -> list[str]:
    """weaved's children that are zombies, after it had a few looks at Slurm."""
    def look() -> list[str]:
        out = []
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for pid in (task / "children").read_text().split():
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[0] == "Z":
                        out.append(f"{pid} {stat.split(')')[0].split('(', 1)[1]}")
        return out
    return settle(look, 15, interval_s=0.5, until=lambda z: not z)


def _leftovers(p: Place, rep: ChaosReport) -> None:
    """No node daemon or worker on any host (their command lines name this instance's
    checkpoint root) and no segment in any host's /dev/shm."""
    rep.processes_left = not daemons_gone(p.dirs.node_ckpt, 30)
    for node in node_names(p.cluster):
        paths = [q for q in shm_paths(p.cluster, node, Path("/dev/shm")) if "weave" in q]
        segments = [q for q in paths if q.endswith(SEG_SUFFIX)]
        other = [q for q in paths if q not in segments
                 and any(str(j) in Path(q).parts for j in rep.jobs)]
        if segments:
            rep.segments_left[node] = segments
        if other:
            rep.shm_left[node] = other
