"""weaved's start: seconds from ``weave daemon`` to a socket that answers.

    python bench/weaved_start.py --runs 10 --json OUT [--python PY] [--tree DIR]

Starts ``weave daemon --backend local`` (a fresh state dir each run, the built-in site,
the group runtime as by default), connects to its Unix socket as soon as the file is
there, and sends ``ping``. Per run: the seconds until the socket accepts a connection,
until the ping is answered, and the CPU seconds weaved had used by then (utime + stime:
the work itself, which a loaded machine inflates less than the wall clock). Then the
import alone: ``python -X importtime -c 'import weave_slurm.daemon.service'`` (its
total, and the CPU seconds of a process doing only that import), whether torch or numpy
came with it, and a bare ``python -c pass`` measured in the same run (the interpreter's
own start, to read the rest against). The goal is a
socket in under 0.5 s on an idle machine.

``--python`` and ``--tree`` pick the interpreter and the checkout the daemon runs from
(default: this one), so the same script measures another commit's tree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
IMPORT = "import weave_slurm.daemon.service"
HEAVY = "import sys, weave_slurm.daemon.service; print(sorted({m.split('.')[0] for m in " \
        "sys.modules if m.split('.')[0] in ('torch', 'numpy')}))"
_TOTAL = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| weave_slurm\.daemon\.service$", re.M)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ping(sock: socket.socket) -> None:
    sock.sendall(b'{"op": "ping"}\n')
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("weaved closed the connection before answering ping")
        buf += chunk
    if not json.loads(buf).get("ok"):
        raise RuntimeError(f"weaved refused ping: {buf!r}")


def _wait_connect(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weave daemon exited with {proc.returncode} before listening")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            time.sleep(0.002)
    raise RuntimeError(f"no socket at {path} after {timeout_s} s")


def one_start(python: str, tree: Path, timeout_s: float) -> dict[str, float]:
    """One ``weave daemon`` start: seconds to connect, to the ping's answer, CPU seconds."""
    state = Path(tempfile.mkdtemp(prefix="weaved-start-"))
    sock_path = state / "weaved.sock"
    argv = [python, "-m", "weave_slurm.cli", "daemon", "--state-dir", str(state),
            "--backend", "local"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        sock = _wait_connect(sock_path, proc, timeout_s)
        t_connect = time.perf_counter() - t0
        cpu = cpu_s(proc.pid)
        with sock:
            sock.settimeout(timeout_s)
            _ping(sock)
        t_ping = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)
    return {"connect_s": t_connect, "ping_s": t_ping, "cpu_s": cpu}


def import_total_s(python: str, tree: Path) -> float:
    """``-X importtime``'s cumulative figure for importing weaved's service module."""
    res = subprocess.run([python, "-X", "importtime", "-c", IMPORT], cwd=tree,
                         capture_output=True, text=True, check=True)
    m = _TOTAL.search(res.stderr)
    if m is None:
        raise RuntimeError(f"no importtime line for weave_slurm.daemon.service:\n{res.stderr}")
    return int(m.group(1)) / 1e6


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_s(argv: list[str], tree: Path) -> tuple[float, float]:
    """Wall and CPU seconds one command takes, start to exit."""
    t0, c0 = time.perf_counter(), _children_cpu_s()
    subprocess.run(argv, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _children_cpu_s() - c0


def measure(python: str, tree: Path, runs: int, timeout_s: float) -> dict[str, Any]:
    starts = [one_start(python, tree, timeout_s) for _ in range(runs)]
    series = {k: [s[k] for s in starts] for k in ("connect_s", "ping_s", "cpu_s")}
    series["import_s"] = [import_total_s(python, tree) for _ in range(runs)]
    series["import_cpu_s"] = [run_s([python, "-c", IMPORT], tree)[1] for _ in range(runs)]
    bare = [run_s([python, "-c", "pass"], tree) for _ in range(runs)]
    series["python_pass_s"] = [wall for wall, _ in bare]
    series["python_pass_cpu_s"] = [cpu for _, cpu in bare]
    heavy = subprocess.run([python, "-c", HEAVY], cwd=tree, capture_output=True, text=True,
                           check=True).stdout.strip()
    stats = {k: {"n": len(xs), "p50": statistics.median(xs), "p90": pct(xs, 0.9),
                 "min": min(xs), "max": max(xs)} for k, xs in series.items()}
    load1, _, _ = os.getloadavg()
    return {"python": python, "tree": str(tree), "runs": runs, "heavy_modules": heavy,
            "loadavg_1m": load1, "cpus": os.cpu_count(), "stats": stats}


ROWS = (("connect_s", "weave daemon: socket accepts a connection"),
        ("ping_s", "weave daemon: ping answered"),
        ("cpu_s", "weave daemon: its CPU seconds at connect"),
        ("import_s", "import daemon.service: -X importtime total"),
        ("import_cpu_s", "import daemon.service: CPU seconds, whole process"),
        ("python_pass_s", "python -c pass: wall"),
        ("python_pass_cpu_s", "python -c pass: CPU seconds"))


def print_table(result: dict[str, Any]) -> None:
    stats = result["stats"]
    table = Table(title=f"weaved start ({result['runs']} runs, tree {result['tree']}, "
                        f"load {result['loadavg_1m']:.1f} on {result['cpus']} CPUs; "
                        f"torch/numpy imported: {result['heavy_modules']})")
    for col in ("MEASURE", "N", "p50 s", "p90 s", "min s", "max s"):
        table.add_column(col, justify="left" if col == "MEASURE" else "right")
    for key, name in ROWS:
        r = stats[key]
        table.add_row(name, str(r["n"]), f"{r['p50']:.3f}", f"{r['p90']:.3f}",
                      f"{r['min']:.3f}", f"{r['max']:.3f}")
    Console().print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that runs weaved (default: this one)")
    ap.add_argument("--tree", type=Path, default=REPO,
                    help="checkout weaved runs from (its cwd; default: this one)")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    args = ap.parse_args()
    result = measure(args.python, args.tree.resolve(), args.runs, args.timeout_s)
    print_table(result)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
