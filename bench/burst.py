"""A burst of submissions from concurrent clients against a live weaved (local backend).

    python bench/burst.py --jobs 2000 --clients 8 --json OUT

The daemon runs in this process with its reconcile loop (tick 0.2 s) on the local
backend (2 h20 + 2 h800 virtual nodes, steps are real processes). ``--clients``
threads each submit their share, one connection per call as the CLIs do, while
one more thread calls ``status`` in a loop. Reported: every submission's outcome
(an id or a one-line reason; nothing may be lost), submit and status latency
p50/p99 during the burst, arrivals per second, and how long the reconcile loop took
to decide every job (placed, or pending with a reason).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import WeaveError


@dataclass
class BurstResult:
    jobs: int
    clients: int
    accepted: int = 0
    refused: int = 0
    lost: int = 0
    stored: int = 0
    duplicates: int = 0
    burst_s: float = 0.0
    arrivals_per_s: float = 0.0
    decided_s: float = 0.0
    submit_p50_ms: float = 0.0
    submit_p99_ms: float = 0.0
    status_p50_ms: float = 0.0
    status_p99_ms: float = 0.0
    status_calls: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def _spec(i: int) -> str:
    # every 10th job can never fit (state larger than a node's memory): a refusal with a reason
    if i % 10 == 9:
        return job_spec_toml(f"burst-{i}", slo=1.5 + (i % 4) * 0.5, rollout_state_gib=99999.0)
    return job_spec_toml(f"burst-{i}", slo=1.5 + (i % 4) * 0.5)


def run_burst(sock: Path, jobs: int, clients: int, timeout_s: float = 600.0) -> BurstResult:
    """Submit ``jobs`` specs from ``clients`` threads while polling status; then wait
    until every stored job is decided. Thread-safe counters; no wall-clock judgement."""
    res = BurstResult(jobs=jobs, clients=clients)
    ids: list[int] = []
    submit_s: list[float] = []
    status_s: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def client(k: int) -> None:
        for i in range(k, jobs, clients):
            t0 = time.perf_counter()
            try:
                with DaemonClient(sock, timeout_s=60) as c:
                    job = c.call(Op.SUBMIT, spec=_spec(i), source=f"burst-{i}.toml")["job"]
                with lock:
                    ids.append(int(job))
            except WeaveError as exc:
                key = type(exc).__name__ if "\n" not in str(exc) else "MULTILINE"
                with lock:
                    res.refused += 1
                    res.reasons[key] = res.reasons.get(key, 0) + 1
            except Exception as exc:  # lost: no id and no reason
                with lock:
                    res.lost += 1
                    res.reasons[f"lost:{type(exc).__name__}"] = \
                        res.reasons.get(f"lost:{type(exc).__name__}", 0) + 1
            with lock:
                submit_s.append(time.perf_counter() - t0)

    def watcher() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            with DaemonClient(sock, timeout_s=60) as c:
                c.call(Op.STATUS)
            status_s.append(time.perf_counter() - t0)
            time.sleep(0.05)

    w = threading.Thread(target=watcher)
    w.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.burst_s = time.perf_counter() - t0
    done.set()
    w.join()
    res.accepted = len(ids)
    res.arrivals_per_s = jobs / res.burst_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # decided: not PENDING, or PENDING with a reason
        with DaemonClient(sock, timeout_s=60) as c:
            rows = c.call(Op.STATUS, all=True)["jobs"]
        if all(r["state"] != "PENDING" or r["reason"] for r in rows):
            break
        time.sleep(0.2)
    res.decided_s = time.perf_counter() - t0
    stored = [r["job"] for r in rows]
    res.stored = len(stored)
    res.duplicates = len(stored) - len(set(stored))
    missing = set(ids) - set(stored)
    res.lost += len(missing)
    res.submit_p50_ms, res.submit_p99_ms = _pct(submit_s, 0.5), _pct(submit_s, 0.99)
    res.status_p50_ms, res.status_p99_ms = _pct(status_s, 0.5), _pct(status_s, 0.99)
    res.status_calls = len(status_s)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="weave-burst-"))
    w = Weaved(DaemonConfig(state_dir=tmp / "state", tick_s=0.2,
                            node_command=("sleep", "infinity")))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        res = run_burst(w.config.socket, args.jobs, args.clients)
    finally:
        for a in w.backend.list_allocations(""):
            w.backend.release(a.alloc_id)
        w.stop()
        t.join(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    table = Table(title=f"weaved burst: {args.jobs} submissions from {args.clients} clients")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in asdict(res).items():
        table.add_row(k, f"{v:.1f}" if isinstance(v, float) else str(v))
    Console().print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(res), indent=1))


if __name__ == "__main__":
    main()
