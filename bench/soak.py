"""Soak: weaved runs a stream of small GRPO jobs for a while under random faults.

    python bench/soak.py --minutes 5 --json bench/results/soak.json
    python bench/soak.py --minutes 3 --backend slurm                  # as root
    python bench/soak.py --backend slurm --cluster-state /srv/c      # a cluster that is up

weaved runs as a separate process (so it can be SIGKILLed) with the group runtime
(real node daemons, resident workers, /dev/shm warm state) on the local backend
(2 h20 + 2 h800 virtual nodes), or on Slurm: a cluster whose nodes are separate hosts
(2 h20 + 2 h800, each its own network, /dev/shm, /tmp; brought up for the soak and
down at the end, or the one up in ``--cluster-state``). There weaved runs on the login
side, its state in the cluster's login dir and its checkpoints on the shared root;
the soak looks at node daemons and warm state on each node's host. A job
(reference GRPO toy, ``--iterations`` steps, a fresh seed) arrives every
``--arrival-s``; every ``--fault-s`` one fault is injected, chosen at random:

* ``weaved-kill``: SIGKILL weaved, start it again on the same state;
* ``worker-kill``: SIGKILL the resident worker of a job while it runs a phase;
* ``cancel``: cancel a running job (it must end CANCELLED).

While it runs, status is polled: each accepted job is listed exactly once, its ITER
never goes backwards and its state never goes back. After ``--minutes`` no more jobs
arrive and every job is waited for. Invariants checked at the end: every accepted job
ended COMPLETED (possibly after re-admissions), or CANCELLED if the soak cancelled it;
no allocation is left in the backend, no node daemon or worker process and no job
segment in the soak's shared-memory root. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.harness
from tests.harness.hosts import (
    LAYOUT,
    free_subnet,
    naming_jobs,
    node_names,
    node_shm,
    node_status,
    on_host,
)
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import WeaveError
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op as NodeOp
from weave_slurm.slurm.backend import Backend, StepHandle
from weave_slurm.slurm.cluster_config import HostMode
from weave_slurm.slurm.local_cluster import LocalCluster

#: The toy's options: small and fast (4 prompts x 4 samples).
OPTIONS = {"prompts_per_step": 4, "group_size": 4}

LAUNCH = """\
import json, logging, sys
from pathlib import Path
from weave_slurm.daemon.service import DaemonConfig, Weaved
a = json.loads(sys.argv[1])
logging.basicConfig(level=logging.WARNING, format="%(asctime)s weaved %(message)s")
Weaved(DaemonConfig(state_dir=Path(a["state"]), backend=a["backend"], instance=a["instance"],
                    tick_s=0.3, shm_root=Path(a["shm"]), runtime="rl",
                    checkpoint_root=Path(a["ckpt"]) if a["ckpt"] else None,
                    client_timeout_s=5.0, env=a["env"])).run()
"""

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "REFUSED"}
RANK = {"PENDING": 0, "PLACED": 1, "RUNNING": 2, "CANCELLING": 3, **{s: 4 for s in FINAL}}
FAULTS = ("weaved-kill", "worker-kill", "cancel")


@dataclass
class Result:
    minutes: float
    backend: str
    seed: int
    hosts: str = "shared"            # the nodes' hosts: "separate" on Slurm
    submitted: int = 0
    refused_at_submit: int = 0
    faults: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAULTS})
    faults_skipped: int = 0          # nothing to hit at that moment
    final: dict[str, int] = field(default_factory=dict)
    readmissions: int = 0            # recoveries summed over jobs (from their reasons)
    violations: list[str] = field(default_factory=list)
    status_polls: int = 0
    wall_s: float = 0.0
    drain_s: float = 0.0             # from the last arrival to every job ended
    leaked_allocations: int = 0
    leaked_processes: int = 0
    leaked_shm_paths: int = 0


class Soak:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster | None = None) -> None:
        self.args = args
        self.cluster = cluster       # Slurm: the separate-hosts cluster
        self.rng = random.Random(args.seed)
        self.instance = f"soak{os.getpid()}"
        if cluster is None:          # the local backend: every node on this host
            self.public = Path(tempfile.mkdtemp(prefix="weave-soak-"))
            self.public.chmod(0o755)
            self.shm = Path(tempfile.mkdtemp(prefix="weave-soak-", dir="/dev/shm"))
            self.shm.chmod(0o711)
            self.ckpt: Path | None = None
            self.env: dict[str, str] = {}
        else:                        # state on the login side, checkpoints shared
            self.public = cluster.paths.login_dir / self.instance
            self.public.mkdir(parents=True)
            self.shm = Path("/dev/shm/weave-nodes")   # each host's own (node-local)
            self.ckpt = cluster.shared_paths().ckpt   # nodes: <ckpt>/<instance>/<node>
            self.env = dict(cluster.env)
        self.state = self.public / "state"
        self.socket = self.state / "weaved.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.res = Result(args.minutes, args.backend, args.seed,
                          hosts="separate" if cluster else "shared")
        self.ids: list[int] = []
        self.cancelled: set[int] = set()
        self.seen: dict[int, tuple[int, int]] = {}   # job -> (state rank, iter)
        self.next_seed = 0

    # -- weaved ------------------------------------------------------------------------
    def start(self) -> None:
        args = {"state": str(self.state), "backend": self.args.backend, "shm": str(self.shm),
                "instance": self.instance if self.args.backend == "slurm" else "",
                "ckpt": str(self.ckpt) if self.ckpt else "", "env": self.env}
        with open(self.public / "weaved.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(args)],
                                         stdout=log, stderr=log)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with contextlib.suppress(WeaveError, OSError):
                self.call(Op.PING)
                return
            time.sleep(0.1)
        raise RuntimeError(f"weaved did not answer; see {self.public / 'weaved.log'}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        with DaemonClient(self.socket) as client:
            return dict(client.call(op, **args))

    def backend(self) -> Backend:
        from weave_slurm.slurm.factory import make_backend

        return make_backend(self.args.backend, state_dir=self.state / "local",
                            env=self.env or None)

    # -- the stream --------------------------------------------------------------------
    def submit(self) -> None:
        self.next_seed += 1
        spec = job_spec_toml(f"soak-{self.next_seed}", iterations=self.args.iterations,
                             seed=self.next_seed, options=OPTIONS)
        try:
            self.ids.append(int(self.call(Op.SUBMIT, spec=spec, source="soak")["job"]))
            self.res.submitted += 1
        except WeaveError:
            self.res.refused_at_submit += 1

    def poll(self) -> list[dict[str, Any]]:
        rows = list(self.call(Op.STATUS, all=True)["jobs"])
        self.res.status_polls += 1
        listed = [r["job"] for r in rows]
        for job in self.ids:
            if listed.count(job) != 1:
                self.violate(f"job {job} listed {listed.count(job)} times")
        for r in rows:
            it = int(r["iter"].split("/")[0]) if r["iter"] else -1
            rank, last_it = self.seen.get(r["job"], (0, -1))
            if RANK[r["state"]] < rank:
                self.violate(f"job {r['job']} went back to {r['state']}")
            if it >= 0 and it < last_it:
                self.violate(f"job {r['job']} ITER went back {last_it} -> {it}")
            self.seen[r["job"]] = (max(rank, RANK[r["state"]]), max(it, last_it))
        return rows

    def violate(self, what: str) -> None:
        if what not in self.res.violations:
            self.res.violations.append(what)

    # -- faults ------------------------------------------------------------------------
    def fault(self, rows: list[dict[str, Any]]) -> None:
        kind = self.rng.choice(FAULTS)
        running = [r["job"] for r in rows if r["state"] == "RUNNING"]
        if kind == "weaved-kill":
            self.kill9()
            self.start()
        elif kind == "cancel":
            if not running:
                self.res.faults_skipped += 1
                return
            job = self.rng.choice(running)
            if self.call(Op.CANCEL, jobs=[job])["results"][0]["ok"]:
                self.cancelled.add(job)
        elif not self.kill_worker():
            self.res.faults_skipped += 1
            return
        self.res.faults[kind] += 1

    def kill_worker(self, within_s: float = 3.0) -> bool:
        """SIGKILL one resident worker that is running a phase, looking for one for up to
        ``within_s`` (the toy's phases last a fraction of a second); False if none was.
        On separate hosts the node daemons are asked on their hosts; the pid is the
        machine's (no pid namespace per host), so the kill comes from here."""
        end = time.monotonic() + within_s
        while True:
            busy = [int(act["pid"]) for jobs in self.node_jobs() for j in jobs
                    if (act := j.get("worker") or {}).get("state") == "running"
                    and act.get("pid")]
            if busy or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if not busy:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.rng.choice(busy), signal.SIGKILL)
        return True

    def node_jobs(self) -> list[list[dict[str, Any]]]:
        """Each answering node daemon's jobs (its ``status``)."""
        out = []
        if self.cluster is None:
            for sock in (self.state / "nodes").glob("node-*.sock"):
                with contextlib.suppress(WeaveError, OSError), NodeClient(sock, 5.0) as client:
                    out.append(list(client.call(NodeOp.STATUS)["jobs"]))
            return out
        for node in node_names(self.cluster):
            status = node_status(self.cluster, node, self.instance)
            if status is not None:
                out.append(list(status["jobs"]))
        return out

    def shm_left(self) -> int:
        """Paths of this soak's jobs still in shared memory (every host's, on Slurm)."""
        if self.cluster is None:
            return len([p for p in self.shm.rglob("*") if p.name in {str(j) for j in self.ids}])
        return sum(len(naming_jobs(on_host(self.cluster, node, [
            "find", str(node_shm(self.instance, node)), "-mindepth", "1"]).splitlines(),
            self.ids)) for node in node_names(self.cluster))

    # -- run and check -----------------------------------------------------------------
    def run(self) -> Result:
        t0 = time.monotonic()
        self.start()
        end = t0 + self.args.minutes * 60
        next_job, next_fault = t0, t0 + self.args.fault_s
        rows: list[dict[str, Any]] = []
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_job:
                self.submit()
                next_job += self.args.arrival_s
            with contextlib.suppress(WeaveError, OSError):
                rows = self.poll()
            if now >= next_fault:
                self.fault(rows)
                next_fault += self.args.fault_s
            time.sleep(0.5)
        last = time.monotonic()
        drain_end = last + self.args.drain_s
        while time.monotonic() < drain_end:
            with contextlib.suppress(WeaveError, OSError):
                rows = self.poll()
                if all(r["state"] in FINAL for r in rows if r["job"] in self.ids):
                    break
            time.sleep(1.0)
        self.res.drain_s = time.monotonic() - last
        self.res.wall_s = time.monotonic() - t0
        self.check_final(rows)
        return self.res

    def check_final(self, rows: list[dict[str, Any]]) -> None:
        by_id = {r["job"]: r for r in rows}
        for job in self.ids:
            row = by_id.get(job)
            state = row["state"] if row else "MISSING"
            self.res.final[state] = self.res.final.get(state, 0) + 1
            want = {"CANCELLED", "COMPLETED"} if job in self.cancelled else {"COMPLETED"}
            if state not in want:
                self.violate(f"job {job} ended {state}: {row['reason'] if row else '-'}")
            found = re.search(r"after (\d+) recover", str(row["reason"] if row else ""))
            self.res.readmissions += int(found.group(1)) if found else 0
        time.sleep(3.0)   # the last group drains
        backend = self.backend()
        prefix = f"weave-g{self.instance}." if self.args.backend == "slurm" else ""
        end = time.monotonic() + 30
        while backend.list_allocations(prefix) and time.monotonic() < end:
            time.sleep(0.5)
        self.res.leaked_allocations = len(backend.list_allocations(prefix))
        self.res.leaked_processes = len(self.processes())
        self.res.leaked_shm_paths = self.shm_left()
        for what, n in (("allocations", self.res.leaked_allocations),
                        ("node daemon/worker processes", self.res.leaked_processes),
                        ("job paths in shm", self.res.leaked_shm_paths)):
            if n:
                self.violate(f"{n} {what} left behind")

    def processes(self) -> list[int]:
        # what node daemons' command lines name (weaved's own does not)
        marker = str(self.ckpt / self.instance if self.ckpt else self.state.resolve() / "ckpt")
        out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        backend = self.backend()
        prefix = f"weave-g{self.instance}." if self.args.backend == "slurm" else ""
        for a in backend.list_allocations(prefix):
            for s in backend.list_steps(a.alloc_id):
                with contextlib.suppress(WeaveError):
                    backend.cancel_step(StepHandle(a.alloc_id, s.name, 0))
            with contextlib.suppress(WeaveError):
                backend.release(a.alloc_id)
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self.args.keep:
            shutil.rmtree(self.public, ignore_errors=True)
        if self.cluster is None:
            shutil.rmtree(self.shm, ignore_errors=True)
            return
        for node in node_names(self.cluster):   # what the node daemons kept on each host
            with contextlib.suppress(WeaveError):
                on_host(self.cluster, node, ["rm", "-rf", str(node_shm(self.instance, node))])


@contextlib.contextmanager
def slurm_cluster(state: Path | None, keep: bool = False) -> Iterator[LocalCluster]:
    """The separate-hosts cluster in ``state`` (it must be up), or one brought up here
    (2 h20 + 2 h800 hosts) and down at the end, every process of it ended (its state
    dir, weaved's log in it, kept with ``keep``)."""
    if state is not None:
        cluster = LocalCluster(state)
        st = cluster.status()
        if not st.ready or st.hosts is not HostMode.SEPARATE:
            raise SystemExit(f"--cluster-state {state}: no separate-hosts cluster is up "
                             "there; 'weave cluster up --hosts separate --state-dir ...'")
        yield cluster
        return
    own = Path(tempfile.mkdtemp(prefix="weave-soak-cluster-"))
    cluster = LocalCluster(own)
    try:
        cluster.up(LAYOUT, hosts=HostMode.SEPARATE, subnet=free_subnet(), timeout_s=60)
        yield cluster
    finally:
        cluster.down()
        if keep:
            print(f"kept {own} (weaved's log: {cluster.paths.login_dir}/soak*/weaved.log)")
        else:
            shutil.rmtree(own, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="arrivals and faults last this long")
    ap.add_argument("--arrival-s", type=float, default=15.0, help="seconds between job arrivals")
    ap.add_argument("--fault-s", type=float, default=20.0, help="seconds between faults")
    ap.add_argument("--iterations", type=int, default=2, help="training steps per job")
    ap.add_argument("--drain-s", type=float, default=300.0, help="max wait for the last jobs")
    ap.add_argument("--backend", choices=("local", "slurm"), default="local")
    ap.add_argument("--cluster-state", type=Path, default=None,
                    help="slurm: the separate-hosts cluster to use (default: bring one up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the state dir (weaved.log)")
    ap.add_argument("--json", type=Path, default=Path("bench/results/soak.json"))
    args = ap.parse_args()
    if args.backend == "local" and args.cluster_state is not None:
        ap.error("--cluster-state: only with --backend slurm")
    with contextlib.ExitStack() as stack:
        cluster = (stack.enter_context(slurm_cluster(args.cluster_state, args.keep))
                   if args.backend == "slurm" else None)
        soak = Soak(args, cluster)
        try:
            res = soak.run()
        finally:
            soak.cleanup()
    table = Table(title=f"weaved soak: {res.minutes:g} min on {res.backend} "
                  f"({res.hosts} hosts), seed {res.seed}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows: list[tuple[str, object]] = [
        ("jobs submitted (refused at submit)", f"{res.submitted} ({res.refused_at_submit})"),
        *((f"fault: {k}", v) for k, v in res.faults.items()),
        ("faults skipped (nothing to hit)", res.faults_skipped),
        *((f"ended {k}", v) for k, v in sorted(res.final.items())),
        ("re-admissions from checkpoint", res.readmissions),
        ("status polls checked", res.status_polls),
        ("leaked allocations / processes / shm paths",
         f"{res.leaked_allocations} / {res.leaked_processes} / {res.leaked_shm_paths}"),
        ("wall (drain after last arrival)", f"{res.wall_s:.0f} s ({res.drain_s:.0f} s)"),
        ("invariant violations", len(res.violations)),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    console = Console()
    console.print(table)
    for v in res.violations:
        console.print(f"[red]violation:[/red] {v}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(asdict(res), indent=1))
    sys.exit(1 if res.violations else 0)


if __name__ == "__main__":
    main()
