"""Weight sync inside the group runtime: shm handoff vs two-tier sync agents, per sync.

Reference GRPO jobs (``builtin:grpo-toy``, default model unless ``--hidden-size``) run
as a group on the LocalBackend: one training and ``--rollout-nodes`` rollout node
daemons, every member pinned to every rollout node. The run is repeated with each
weight transfer (``RunnerConfig.transfer``): ``shm`` (the executor attaches the
segment and puts it on each rollout node), ``twotier`` (full pieces) and
``twotier-delta``. Every call the executor makes to move a member's weights (train ->
rollout) is timed around the call, from its side; bytes are what landed in rollout
node daemons and, for two-tier, what crossed the "slow link" (stage 1). The first
two-tier sync includes starting the agents (one process per node) and is reported
apart. All nodes share one 2-core host and loopback TCP: this measures the runtime's
overhead per sync, not a network.

    .venv/bin/python bench/runtime_sync.py --jobs 2 --steps 6 --json bench/results/runtime_sync.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import GroupLayout, MemberSpec, NodeRef
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.transfer import WeightTransfer
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer
from weave_slurm.slurm.local_backend import LocalBackend
from weave_slurm.vocab import Pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.harness
from tests.harness.fleet import FleetConfig, NodeFleet

#: kind -> its ``[runtime]`` keys
KINDS: dict[str, dict[str, Any]] = {
    "shm": {"weight_transfer": WeightTransferKind.SHM},
    "twotier": {"weight_transfer": WeightTransferKind.TWOTIER},
    "twotier-delta": {"weight_transfer": WeightTransferKind.TWOTIER, "sync_mode": "delta"}}


class Timed:
    """Wraps the executor's transfer; records every train -> rollout weights move."""

    def __init__(self, inner: WeightTransfer) -> None:
        self.inner = inner
        self.samples: list[dict[str, Any]] = []

    def copy(self, src: NodeRef, dsts: Sequence[NodeRef], job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]:
        t0 = time.perf_counter()
        version, moved = self.inner.copy(src, dsts, job, name, as_name)
        dt = time.perf_counter() - t0
        if src.pool is Pool.TRAIN and any(d.pool is Pool.ROLLOUT for d in dsts):
            slow, sync_s, put_s = moved, None, None
            if isinstance(self.inner, TwoTierTransfer) and self.inner.records:
                rec = self.inner.records[-1]
                slow = rec.slow_link_bytes
                sync_s = max(float(r["elapsed_s"]) for r in rec.replies.values())
                put_s = max(float(r.get("put_s", 0.0)) for r in rec.replies.values())
            self.samples.append({"job": job.job_id, "version": version, "time_s": dt,
                                 "node_bytes": moved, "link_bytes": slow,
                                 "sync_s": sync_s, "put_s": put_s})
        return version, moved

    def forget(self, job: JobRef) -> None:
        self.inner.forget(job)

    def close(self) -> None:
        self.inner.close()


def run_kind(layout: GroupLayout, kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    pins = tuple(range(len(layout.rollout)))
    opts: dict[str, Any] = {"prompts_per_step": 4, "group_size": 4}
    if args.hidden_size:
        opts.update(hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size)
    members = [MemberSpec(f"{kind}-{i}", seed=i, steps=args.steps, options=opts,
                          rollout_pins=pins) for i in range(args.jobs)]
    ex = GroupRunner(layout, members, config=RunnerConfig(**KINDS[kind]))
    timed = Timed(ex.transfer)
    ex.transfer = timed
    try:
        ex.run(timeout_s=1800)
    finally:
        port = GroupPort(ex)
        port.apply(*(Leave(job) for job in port.order))
        ex.close()
    return timed.samples


def summarise(kind: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    steady = samples[1:] if kind.startswith("twotier") else samples
    times = [s["time_s"] for s in steady]
    sync = [s["sync_s"] for s in steady if s["sync_s"] is not None]
    put = [s["put_s"] for s in steady if s["put_s"] is not None]
    return {"kind": kind, "syncs": len(samples), "first_s": samples[0]["time_s"],
            "median_s": statistics.median(times),
            "p90_s": sorted(times)[min(len(times) - 1, int(0.9 * len(times)))],
            "node_bytes": statistics.median(s["node_bytes"] for s in steady),
            "link_bytes_median": statistics.median(s["link_bytes"] for s in steady),
            "link_bytes_total": sum(s["link_bytes"] for s in samples),
            "agent_sync_median_s": statistics.median(sync) if sync else None,
            "agent_put_median_s": statistics.median(put) if put else None,
            "samples": samples}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rollout-nodes", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=0, help="0 = the job's default")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    parser.add_argument("--json", type=Path, default=None, dest="json_out")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="weave-bench-rsync-"))
    shm = Path(tempfile.mkdtemp(prefix="weave-bench-rsync-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    fleet = NodeFleet(LocalBackend(work / "backend"),
                      FleetConfig("bench", shm, work, rollout_nodes=args.rollout_nodes,
                                  host_mem_gib=1.0))
    rows = []
    try:
        layout = fleet.start()
        for kind in args.kinds:
            rows.append(summarise(kind, run_kind(layout, kind, args)))
    finally:
        fleet.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    table = Table(title=f"weights train -> {args.rollout_nodes} rollout nodes, {args.jobs} "
                  f"jobs x {args.steps} steps (per sync, executor side)")
    for col in ("transfer", "syncs", "first sync", "median", "p90", "in agents: sync",
                "in agents: put", "bytes into rollout nodes", "slow-link bytes (median)"):
        table.add_column(col, justify="left" if col == "transfer" else "right")
    for r in rows:
        table.add_row(r["kind"], str(r["syncs"]), f"{r['first_s'] * 1e3:.1f} ms",
                      f"{r['median_s'] * 1e3:.1f} ms", f"{r['p90_s'] * 1e3:.1f} ms",
                      _ms(r["agent_sync_median_s"]), _ms(r["agent_put_median_s"]),
                      f"{r['node_bytes'] / 2**20:.2f} MiB",
                      f"{r['link_bytes_median'] / 2**20:.2f} MiB")
    Console(width=150).print(table)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items()
                                                      if k != "json_out"},
                                             "load_avg": os.getloadavg(), "rows": rows},
                                            indent=1))


if __name__ == "__main__":
    main()
