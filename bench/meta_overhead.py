"""Meta-iteration overhead: one member's phase ending -> the next member's starting (warm).

Three reference GRPO jobs (``builtin:grpo-toy``) share one h20 and one h800 node
daemon on the LocalBackend. For each node, every back-to-back pair of phases of two
different members where the second was already waiting gives one gap, measured on
the workers' side (entry returned -> next entry received; host CLOCK_MONOTONIC). The
first two phases of each member (model build in fresh resident workers) are left
out: this is the warm switch. Compared against the phase lengths of the job.

    .venv/bin/python bench/meta_overhead.py --steps 20 --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.timeline import Span, switch_gaps_s
from weave_slurm.slurm.local_backend import LocalBackend
from weave_slurm.vocab import Phase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.harness
from tests.harness.fleet import FleetConfig, NodeFleet


def _warm(spans: list[Span]) -> list[Span]:
    seen: dict[tuple[str, Phase], int] = {}
    out = []
    for s in sorted(spans, key=lambda s: s.start_s):
        key = (s.job_id, s.kind)
        seen[key] = seen.get(key, 0) + 1
        if s.kind is not Phase.SYNC and seen[key] > (2 if s.kind is Phase.TRAIN else 1):
            out.append(s)
    return out


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None, dest="json_out")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="weave-bench-meta-"))
    shm = Path(tempfile.mkdtemp(prefix="weave-bench-meta-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    fleet = NodeFleet(LocalBackend(work / "backend"), FleetConfig("bench", shm, work))
    try:
        layout = fleet.start()
        members = [MemberSpec(f"m{i}", seed=i, steps=args.steps) for i in range(args.jobs)]
        ex = GroupRunner(layout, members, config=RunnerConfig(poll_s=args.poll_ms / 1e3))
        try:
            ex.run()
            spans = list(ex.spans)
        finally:
            port = GroupPort(ex)
            port.apply(*(Leave(job) for job in port.order))
            ex.close()
    finally:
        fleet.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    warm = _warm(spans)
    rows = []
    for kind in (Phase.ROLLOUT, Phase.TRAIN):
        gaps = switch_gaps_s(warm, kind)
        phase = [s.worker_end_s - s.worker_start_s for s in warm
                 if s.kind is kind and s.worker_end_s is not None
                 and s.worker_start_s is not None]
        if not gaps or not phase:
            continue
        med_phase = statistics.median(phase)
        rows.append({"pool": "h20 (rollout)" if kind is Phase.ROLLOUT else "h800 (train)",
                     "switches": len(gaps), "gap_median_ms": 1e3 * statistics.median(gaps),
                     "gap_p90_ms": 1e3 * _pct(gaps, 0.9), "gap_max_ms": 1e3 * max(gaps),
                     "phase_median_ms": 1e3 * med_phase,
                     "overhead_pct": 100 * statistics.median(gaps) / med_phase})
    table = Table(title=f"meta-iteration overhead, warm ({args.jobs} jobs x {args.steps} "
                  f"steps, poll {args.poll_ms} ms)")
    for col in ("POOL", "SWITCHES", "GAP_MED_MS", "GAP_P90_MS", "GAP_MAX_MS",
                "PHASE_MED_MS", "OVERHEAD"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["pool"]), str(r["switches"]), f"{r['gap_median_ms']:.1f}",
                      f"{r['gap_p90_ms']:.1f}", f"{r['gap_max_ms']:.1f}",
                      f"{r['phase_median_ms']:.0f}", f"{r['overhead_pct']:.1f}%")
    Console().print(table)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"steps": args.steps, "jobs": args.jobs,
                                             "poll_ms": args.poll_ms, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
