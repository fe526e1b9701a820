"""Trace-replay benchmarks: the paper's targets (docs/simulator.md).

    .venv/bin/python bench/simulate.py [--json OUT] [--skip-10k] [--skip-optimal]

Cases: wild.trace in reference and consistent accounting (all policies but optimal,
timed); the trade-off of weave's charged re-planning (arrival placement alone, then each
re-planning step added) on wild; three generated 200-job traces in both accountings;
philly_0_30000_20_parsed_all with groups <= 3 against the exact optimum; a 10,000-job
generated trace (timed); drift (static vs reacting vs hourly regroup); long-tail
migration's throughput effect on the wild groups; node failures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.baselines import make_policy
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.optimum import optimum
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.drift import DriftModel, DriftPattern
from weave_slurm.sim.execution import RolloutModel, migration_speedup
from weave_slurm.sim.failures import FailureModel
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.policies import Accounting, SimPolicy, job_profile
from weave_slurm.sim.replay import Replay, ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report

GPUS = {"rollout": 8, "train": 8}
ALL_BUT_OPTIMAL = ("weave", "weave-online", "weave-live", "isolated", "colocated", "random",
                   "most-idle", "regroup")
FIELDS = ("reference_units", "cost_per_hour", "slo_attainment", "slo_violations",
          "life_slo_violations", "admissions_pct", "ratios", "migrations", "repins", "pause_h",
          "slo_check", "bound", "cost_over_bound", "bubble", "iterations")
#: weave's re-planning steps, added one at a time (SimPolicy flags).
STEPS: tuple[tuple[str, dict[str, bool]], ...] = (
    ("arrivals only (weave-online)", {}),
    ("+ consolidation after departures", {"consolidate": True}),
    ("+ recent arrivals re-placed", {"consolidate": True, "replace_recent": True}),
    ("+ hourly re-plan (weave)", {"consolidate": True, "replace_recent": True,
                                  "replan": True}),
    ("hourly re-plan alone", {"replan": True}),
    # weave without re-placing recent arrivals, then also only the moves weaved can
    # carry out (onto held nodes, or waiting for nodes where the old group's plan stays
    # the one the job runs: the weave-live policy)
    ("consolidation + hourly re-plan", {"consolidate": True, "replan": True}),
    ("... moves weaved carries out (weave-live)", {"consolidate": True, "replan": True,
                                                   "weaved_moves": True}),
)
GENERATED_SEEDS = (11, 12, 13)


def _cap(n: int) -> Capacity:
    return Capacity.from_site(reference_site(), n)


def wild(accounting: Accounting) -> dict[str, Any]:
    trace = load_trace("wild")
    t0, c0 = time.perf_counter(), time.process_time()
    res = replay_policies(trace, _cap(5), ALL_BUT_OPTIMAL, ReplayOptions(accounting=accounting))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    rep = build_report(res, GPUS, verify=("weave",))["policies"]
    return {"replay_s": round(elapsed, 2), "replay_cpu_s": round(cpu, 2),
            "policies": {n: {k: rep[n].get(k) for k in FIELDS} for n in rep}}


def _row(s: dict[str, Any]) -> dict[str, Any]:
    return {"vs_isolated": s["ratios"].get("vs_isolated"),
            "vs_colocated": s["ratios"].get("vs_colocated"),
            "cost_over_bound": s["cost_over_bound"], "bubble": s["bubble"],
            "slo_violations": s["slo_violations"],
            "life_slo_violations": s["life_slo_violations"], "migrations": s["migrations"],
            "repins": s["repins"], "pause_h": s["pause_h"],
            "admissions_pct": s["admissions_pct"]}


def tradeoff() -> dict[str, Any]:
    """Each of weave's charged re-planning steps added to arrival placement, on wild."""
    trace = load_trace("wild")
    out: dict[str, Any] = {}
    for acc in Accounting:
        opts = ReplayOptions(accounting=acc)
        results = {n: Replay(trace, _cap(5), SimPolicy.make(n), opts).run()
                   for n in ("isolated", "colocated")}
        cpu: dict[str, float] = {}
        for label, flags in STEPS:
            c0 = time.process_time()
            pol = SimPolicy(label, make_policy("weave"), **flags)
            results[label] = Replay(trace, _cap(5), pol, opts).run()
            cpu[label] = round(time.process_time() - c0, 2)
        rep = build_report(results, GPUS)["policies"]
        out[acc.value] = {label: {**_row(rep[label]), "replay_cpu_s": cpu[label]}
                          for label, _ in STEPS}
    return out


def generated() -> dict[str, Any]:
    """weave against arrival placement and the baselines on traces not seen in tuning."""
    out: dict[str, Any] = {}
    for seed in GENERATED_SEEDS:
        trace = generate_trace(GeneratorConfig(n_jobs=200, seed=seed))
        for acc in Accounting:
            res = replay_policies(trace, _cap(5), ("weave", "weave-online", "weave-live",
                                                   "isolated", "colocated"),
                                  ReplayOptions(accounting=acc))
            rep = build_report(res, GPUS)["policies"]
            out[f"seed{seed}_{acc.value}"] = {n: _row(rep[n]) for n in ("weave", "weave-online",
                                                                        "weave-live")}
    return out


def floor_snapshots(every_h: float = 6.0, max_jobs: int = 9) -> dict[str, Any]:
    """How much bubble is structural: every ``every_h`` hours of wild, the jobs running
    then (when at most ``max_jobs``) grouped by the exact minimum-cost optimum
    (placement.optimum), and the cost / bound and bubbles of that grouping (consistent
    shapes), next to the batch placer's on the same set."""
    trace = load_trace("wild")
    cap = _cap(5)
    prof = {j.job_id: job_profile(j, "weave", Accounting.CONSISTENT) for j in trace.jobs}
    rows: list[dict[str, Any]] = []
    for k in range(int(trace.end_s / 3600 / every_h) + 1):
        t = k * every_h * 3600
        jobs = [prof[j.job_id] for j in trace.jobs
                if j.arrival_s <= t < (j.departure_s if j.departure_s is not None else 1e18)]
        if not 2 <= len(jobs) <= max_jobs:
            continue
        exact = ClusterState(cap, optimum(jobs, cap).groups, 1 + len(jobs))
        batch = place_batch(make_policy("weave"), ClusterState(cap), jobs).state
        rows.append({"t_h": round(t / 3600, 1), "jobs": len(jobs),
                     "optimum_cost_over_bound": round(exact.cost_per_hour / exact.work_per_hour, 4),
                     "optimum_bubble": _bubbles(exact),
                     "batch_cost_over_optimum": round(batch.cost_per_hour
                                                      / exact.cost_per_hour, 4)})
    if not rows:
        return {"snapshots": rows}
    return {"snapshots": rows,
            "mean_optimum_cost_over_bound": round(statistics.mean(
                r["optimum_cost_over_bound"] for r in rows), 4),
            "mean_optimum_bubble": {p: round(statistics.mean(r["optimum_bubble"][p]
                                                             for r in rows), 4)
                                    for p in ("rollout", "train")}}


def _bubbles(state: ClusterState) -> dict[str, float]:
    r = sum(g.schedule.rollout_busy * g.rollout_nodes for g in state.groups)
    t = sum(g.schedule.train_busy * g.train_nodes for g in state.groups)
    return {"rollout": round(1 - r / state.rollout_nodes_used, 4),
            "train": round(1 - t / state.train_nodes_used, 4)}


def philly_optimal() -> dict[str, Any]:
    trace = load_trace("philly_0_30000_20_parsed_all")
    t0 = time.perf_counter()
    res = replay_policies(trace, _cap(3), ("weave", "weave-online", "optimal"),
                          ReplayOptions(optimum_max_jobs=12))
    opt = res["optimal"].reference_units
    return {"replay_s": round(time.perf_counter() - t0, 2), "optimum": round(opt, 1),
            "optimum_fallback_intervals": res["optimal"].optimum_fallbacks,
            "reference_greedy_over_optimum": 1.090,
            **{f"{n}_over_optimum": round(res[n].reference_units / opt, 4)
               for n in ("weave", "weave-online")},
            **{f"{n}_cost": round(res[n].reference_units, 1) for n in ("weave", "weave-online")}}


def big_trace() -> dict[str, Any]:
    trace = generate_trace(GeneratorConfig(n_jobs=10_000, seed=1))
    t0, c0 = time.perf_counter(), time.process_time()
    res = replay_policies(trace, _cap(5), ("weave", "isolated", "colocated"))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    w = res["weave"].reference_units
    return {"jobs": 10_000, "max_concurrent": trace.max_concurrent(),
            "replay_s": round(elapsed, 1),
            # CPU seconds: the replay is single-threaded, so on an idle 2-core machine
            # its wall time is its CPU time; on a shared one wall time can be 3x that.
            "replay_cpu_s": round(cpu, 1),
            "vs_isolated": round(res["isolated"].reference_units / w, 4),
            "vs_colocated": round(res["colocated"].reference_units / w, 4)}


def drift() -> dict[str, Any]:
    trace = load_trace("wild")
    out: dict[str, Any] = {}
    for pattern in DriftPattern:
        opts = ReplayOptions(drift=DriftModel(pattern, amplitude=0.5))
        res = replay_policies(trace, _cap(5), ("weave-online", "weave", "regroup"), opts)
        rep = build_report(res, GPUS)["policies"]
        regroup = rep["regroup"]["reference_units"]
        out[pattern.value] = {n: {"cost_over_regroup": round(rep[n]["reference_units"] / regroup,
                                                               4),
                                  "slo_attainment": rep[n]["slo_attainment"]} for n in rep}
    return out


def migration() -> dict[str, Any]:
    trace = load_trace("wild")
    res = replay_policies(trace, _cap(5), ("weave",))["weave"]
    model = RolloutModel(mean_fraction=0.9, sigma=0.15)
    weighted = total = 0.0
    best = 1.0
    seen: dict[int, float] = {}
    for seg in res.segments:
        if seg.group.size < 2:
            continue
        key = id(seg.group)
        if key not in seen:
            seen[key] = migration_speedup(seg.group, model, meta_iterations=30)
        dt = seg.end_s - seg.start_s
        weighted += seen[key] * dt
        total += dt
        best = max(best, seen[key])
    return {"time_weighted_speedup": round(weighted / total, 4) if total else 1.0,
            "max_group_speedup": round(best, 4), "groups": len(seen)}


def failures() -> dict[str, Any]:
    trace = load_trace("wild")
    opts = ReplayOptions(accounting=Accounting.CONSISTENT,
                         failures=FailureModel(0.001, checkpoint_every_iterations=10, seed=7))
    res = replay_policies(trace, _cap(5), ("weave", "isolated"), opts)
    return {n: {"failures": r.failures, "lost_iterations": round(
        sum(x.lost_iterations for x in r.runs.values()), 1),
        "reference_units": round(r.reference_units, 1)} for n, r in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-10k", action="store_true")
    ap.add_argument("--skip-optimal", action="store_true")
    ap.add_argument("--skip-floor", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {"wild_reference": wild(Accounting.REFERENCE),
                           "wild_consistent": wild(Accounting.CONSISTENT),
                           "tradeoff": tradeoff(), "generated": generated()}
    if not args.skip_optimal:
        out["philly_optimal"] = philly_optimal()
    if not args.skip_floor:
        out["structural_floor"] = floor_snapshots()
    if not args.skip_10k:
        out["generated_10k"] = big_trace()
    out["drift"] = drift()
    out["migration"] = migration()
    out["failures"] = failures()
    console = Console()
    for mode in ("wild_reference", "wild_consistent"):
        _print_policies(console, f"{mode} (replay of all policies: {out[mode]['replay_s']} s)",
                        out[mode]["policies"])
    for acc, rows in out["tradeoff"].items():
        _print_rows(console, f"weave's re-planning steps on wild ({acc} accounting)", rows)
    for case, rows in out["generated"].items():
        _print_rows(console, f"generated 200-job trace {case}", rows)
    if out.get("structural_floor", {}).get("snapshots"):
        f = out["structural_floor"]
        console.print(f"[bold]structural_floor[/bold]: {len(f['snapshots'])} wild snapshots "
                      f"of 2-9 jobs, exact optimum: cost/bound "
                      f"{f['mean_optimum_cost_over_bound']}, bubble {f['mean_optimum_bubble']}")
    for key in ("philly_optimal", "generated_10k", "drift", "migration", "failures"):
        if key in out:
            console.print(f"[bold]{key}[/bold]: {json.dumps(out[key])}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _ratio(p: dict[str, Any], key: str) -> str:
    value = p["cost_over_bound"].get(key)
    return "-" if value is None else f"{value:.3f}"


def _print_policies(console: Console, title: str, policies: dict[str, Any]) -> None:
    table = Table(title=title)
    for col in ("policy", "h800-node-s", "vs isolated", "vs colocated", "cost/bound",
                "rollout", "train", "SLO att.", "over SLO", "direct/scale/new %", "moves"):
        table.add_column(col, justify="right")
    for name, p in policies.items():
        adm = p["admissions_pct"]
        table.add_row(name, f"{p['reference_units']:,.0f}",
                      str(p["ratios"].get("vs_isolated", "-")),
                      str(p["ratios"].get("vs_colocated", "-")), _ratio(p, "total"),
                      _ratio(p, "rollout"), _ratio(p, "train"),
                      f"{100 * p['slo_attainment']:.2f}%",
                      f"{p['slo_violations']}/{p['life_slo_violations']}",
                      f"{adm['direct']:.1f}/{adm['scale_rollout']:.1f}/{adm['new_group']:.1f}",
                      str(p["migrations"]))
    console.print(table)


def _print_rows(console: Console, title: str, rows: dict[str, Any]) -> None:
    table = Table(title=title)
    for col in ("policy", "vs isolated", "vs colocated", "cost/bound", "rollout", "train",
                "bubble r/t", "over SLO", "moves/re-pins", "pause h"):
        table.add_column(col, justify="right")
    for name, p in rows.items():
        b = p["bubble"]
        table.add_row(name, f"{p['vs_isolated']:.3f}", f"{p['vs_colocated']:.3f}",
                      _ratio(p, "total"), _ratio(p, "rollout"), _ratio(p, "train"),
                      f"{100 * b['rollout']:.1f}/{100 * b['train']:.1f}%",
                      f"{p['slo_violations']}/{p['life_slo_violations']}",
                      f"{p['migrations']}/{p['repins']}", f"{p['pause_h']:.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
