"""weaved API latency: submission and ``weave status`` with 1,000 jobs in the store.

    python bench/daemon.py --jobs 1000 --status-calls 200 --json OUT

Runs the real store (SQLite WAL, synchronous=FULL, on the state dir's disk) and the
real socket server in this process; the reconcile loop is not running, so the
numbers are the API path alone (a submission = parse + profile + one fsynced
transaction). Each call opens a fresh connection, as the CLIs do. Then the whole
``weave status`` command, a new process each time (interpreter start, imports, the
call, the table), against the same server, next to a bare ``python -c pass`` measured
in the same run: the goal is under 200 ms, and on a loaded machine the ratio to the
interpreter's own start says more than the absolute time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from weave_slurm.config.site import default_site
from weave_slurm.daemon.api import Api
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.server import ApiServer
from weave_slurm.daemon.store import Store
from weave_slurm.placement import Capacity

SPEC = """name = "bench-{i}"
slo = 1.5
[model]
params_b = 7.0
[rollout]
prompts_per_step = 64
samples_per_prompt = 8
max_response_tokens = 4096
[gpus]
rollout = 8
train = 8
[profile]
rollout_s = {{ mean = 80.0, max = 96.0 }}
train_s = 77.0
rollout_state_gib = 200.0
train_state_gib = 220.0
"""


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _run(argv: list[str]) -> float:
    """Milliseconds one command takes, start to exit (its output is discarded)."""
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--status-calls", type=int, default=200)
    ap.add_argument("--cli-calls", type=int, default=20)
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    args = ap.parse_args()
    root = args.state_dir or Path(tempfile.mkdtemp(prefix="weaved-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    site = default_site()
    store = Store(root / "weaved.db")
    api = Api(store, site, Capacity.from_site(site), time.time)
    server = ApiServer(root / "weaved.sock", api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    results: dict[str, dict[str, float]] = {}
    try:
        def timed(op: Op, **kw: object) -> float:
            t0 = time.perf_counter()
            with DaemonClient(root / "weaved.sock") as c:
                c.call(op, **kw)
            return (time.perf_counter() - t0) * 1e3

        submit = [timed(Op.SUBMIT, spec=SPEC.format(i=i)) for i in range(args.jobs)]
        status = [timed(Op.STATUS, all=True) for _ in range(args.status_calls)]
        status_active = [timed(Op.STATUS) for _ in range(args.status_calls)]
        cli = [_run([sys.executable, "-m", "weave_slurm.cli", "status", "--socket",
                     str(root / "weaved.sock")]) for _ in range(args.cli_calls)]
        bare = [_run([sys.executable, "-c", "pass"]) for _ in range(args.cli_calls)]
        for name, xs in (("submit", submit), (f"status --all ({args.jobs} jobs)", status),
                         (f"status ({args.jobs} pending)", status_active),
                         (f"weave status, whole command ({args.jobs} pending)", cli),
                         ("python -c pass (the interpreter's start)", bare)):
            results[name] = {"n": len(xs), "p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99),
                             "mean_ms": statistics.fmean(xs)}
    finally:
        server.shutdown()
        server.server_close()
        store.close()
        if args.state_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"weaved API latency ({args.jobs} jobs in the store)")
    for col in ("CALL", "N", "p50 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="left" if col == "CALL" else "right")
    for name, r in results.items():
        table.add_row(name, str(int(r["n"])), f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      f"{r['mean_ms']:.2f}")
    Console().print(table)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"jobs": args.jobs, "results": results},
                                            indent=2) + "\n")


if __name__ == "__main__":
    main()
