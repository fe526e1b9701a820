"""Pooled rollout against node-pinned groups (docs/simulator.md, "Pooled rollout").

    .venv/bin/python bench/pooled_rollout.py [--json OUT] [--skip-sensitivity]

1. **Traces**: wild and three generated 200-job traces (seeds 11-13, not used while
   designing), in consistent and reference accounting: weave and weave-online with the
   groups weaved runs (whole rollout nodes, members pinned) and with pooled rollout
   (``Capacity.rollout_pooled``: a group's rollout side is GPUs that every member's
   rollout spans in turn), against the isolated and co-located baselines.
2. **Sensitivity** (wild, consistent accounting), because pooled groups lean on the
   model of a rollout's width (docs/model.md "Rollout width"): the speed-up of a rollout
   on more GPUs than its own taken as the square root of the model's (half as
   effective) and as none at all, and host memory of 1,024 GiB per node (the paper's
   1-2 TB; the reference site does not limit it), each for pinned and pooled groups.
   The variants patch ``model.perf.width_factor`` for one replay: experiments, not
   features.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import weave_slurm.model.perf as perf
import weave_slurm.placement.repack as repack
from weave_slurm.placement.capacity import Capacity
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.outcome import ReplayResult
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions
from weave_slurm.sim.report import build_report
from weave_slurm.sim.traces import Trace

GPUS = {"rollout": 8, "train": 8}
SEEDS = (11, 12, 13)
POLICIES = ("weave", "weave-online")


def _replays(trace: Trace, cap: Capacity, acc: Accounting,
             policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    """Each policy pinned and pooled, with the baselines; report rows and CPU seconds."""
    opts = ReplayOptions(accounting=acc)
    res: dict[str, ReplayResult] = {n: Replay(trace, cap, SimPolicy.make(n), opts).run()
                                    for n in ("isolated", "colocated")}
    cpu: dict[str, float] = {}
    for name in policies:
        for label, pooled in ((name, False), (f"{name} pooled", True)):
            c0 = time.process_time()
            r = Replay(trace, replace(cap, rollout_pooled=pooled), SimPolicy.make(name),
                       opts).run()
            cpu[label] = round(time.process_time() - c0, 2)
            r.policy = label
            res[label] = r
    rep = build_report(res, GPUS)["policies"]
    return {label: {"vs_isolated": rep[label]["ratios"]["vs_isolated"],
                    "vs_colocated": rep[label]["ratios"]["vs_colocated"],
                    "cost_over_bound": rep[label]["cost_over_bound"]["total"],
                    "bubble": rep[label]["bubble"],
                    "slo_violations": rep[label]["slo_violations"],
                    "life_slo_violations": rep[label]["life_slo_violations"],
                    "migrations": rep[label]["migrations"], "repins": rep[label]["repins"],
                    "mean_rollout_nodes": rep[label]["mean_nodes"]["rollout"],
                    "mean_train_nodes": rep[label]["mean_nodes"]["train"],
                    "replay_cpu_s": cpu[label]} for label in cpu}


def traces(cap: Capacity) -> dict[str, Any]:
    cases: list[tuple[str, Trace]] = [("wild", load_trace("wild"))]
    cases += [(f"seed{s}", generate_trace(GeneratorConfig(n_jobs=200, seed=s))) for s in SEEDS]
    return {f"{name}_{acc.value}": _replays(trace, cap, acc)
            for name, trace in cases for acc in (Accounting.CONSISTENT, Accounting.REFERENCE)}


@contextlib.contextmanager
def widening(kind: str) -> Iterator[None]:
    """The speed-up of a rollout on more GPUs than its own: the model's ("linear"), its
    square root ("sqrt"), or none ("none"); fewer GPUs stay linear (more waves)."""
    model = perf.width_factor

    def patched(base: int, gpus: int, floor_fraction: float = 0.0) -> float:
        if gpus <= base:
            return model(base, gpus, floor_fraction)
        if kind == "none":
            return 1.0
        return max(float((base / gpus) ** 0.5), min(floor_fraction, 1.0))

    if kind != "linear":
        perf.width_factor = patched  # type: ignore[assignment]
    repack._best_pooled.cache_clear()   # memoised under the other model
    try:
        yield
    finally:
        perf.width_factor = model  # type: ignore[assignment]
        repack._best_pooled.cache_clear()


def sensitivity(cap: Capacity) -> dict[str, Any]:
    wild = load_trace("wild")
    out: dict[str, Any] = {}
    for kind in ("sqrt", "none"):
        with widening(kind):
            out[f"widening_{kind}"] = _replays(wild, cap, Accounting.CONSISTENT, ("weave",))
    small = replace(cap, rollout_mem_gib=1024.0, train_mem_gib=1024.0)
    out["host_mem_1024_gib"] = _replays(wild, small, Accounting.CONSISTENT, ("weave",))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-sensitivity", action="store_true")
    args = ap.parse_args()
    cap = Capacity.from_site(reference_site(), 5)
    out: dict[str, Any] = {"traces": traces(cap)}
    if not args.skip_sensitivity:
        out["sensitivity"] = sensitivity(cap)
    console = Console(width=160)
    for section in out.values():
        for case, rows in section.items():
            table = Table(title=case)
            for col in ("policy", "vs isolated", "vs co-located", "cost/bound",
                        "bubble r / t", "over SLO", "moves / re-pins", "rollout / train nodes",
                        "CPU s"):
                table.add_column(col, justify="right")
            for label, r in rows.items():
                b = r["bubble"]
                table.add_row(label, f"{r['vs_isolated']:.3f}x", f"{r['vs_colocated']:.3f}x",
                              f"{r['cost_over_bound']:.3f}",
                              f"{100 * b['rollout']:.1f} / {100 * b['train']:.1f}%",
                              f"{r['slo_violations']} / {r['life_slo_violations']}",
                              f"{r['migrations']} / {r['repins']}",
                              f"{r['mean_rollout_nodes']:.1f} / {r['mean_train_nodes']:.1f}",
                              f"{r['replay_cpu_s']:.1f}")
            console.print(table)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
