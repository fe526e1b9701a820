"""Placement benchmark: decision time vs active jobs, and the greedy's gap to the optimum.

    python bench/placement.py --active 100,500,1000,2000,5000 --optimality 6,7,8 --json OUT

Jobs are drawn as the reference's own overhead benchmark draws them: rollout and
training seconds uniform in [25, 600], SLO uniform in [1.1, 2], groups of at most 3,
reference accounting (a training node costs 1, a rollout node 1/3). The active jobs
arrive one by one (online); each timed decision places one more arrival on that state
without applying it. Optimality compares the greedy with the exact optimum on random
sets: ``mean_ratio`` places a set as one batch (tightest budget first, as the daemon
does with the arrivals of one tick), ``online_mean_ratio`` in the drawn arrival order,
one lone arrival at a time,
``replace_mean_ratio`` in arrival order with weave's re-placement of recent arrivals:
after each arrival the last ``--recent`` jobs are placed again together when that pays
(placement.replan.replace_jobs; moves charged as in the simulator, with no known
remaining time, so over the default one-hour horizon). ``moves_per_set`` counts the
running jobs that re-placement moved or re-pinned. Co-location is an admission option
of the greedy and of the optimum alike (a drawn job's co-located iteration is its
rollout plus its training, on its one training node; ``--no-colocation``: neither has
it). ``--pooled`` times weave's placement
with pooled rollout instead (docs/placement.md "Pooled rollout"; its optimality is not
measured: it places by cost per unit of work, the optimum minimises cost per hour).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.decision import Placement
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.optimum import optimum
from weave_slurm.placement.replan import replace_jobs
from weave_slurm.sim.accounting import reference_unit_rates

#: The reference scheduler's per-arrival time on a 2-core machine (shared/data/README.md).
REFERENCE_MS = {100: 104.0, 500: 338.0, 1000: 453.0, 2000: 689.0}
REFERENCE_RATIO = {6: 1.078, 7: 1.065, 8: 1.110}


def capacity(pooled: bool = False, colocation: bool = True) -> Capacity:
    return Capacity(max_group_size=3, max_rollout_nodes_per_group=64, rollout_mem_gib=1e9,
                    train_mem_gib=1e9, rollout_pool_nodes=10**7, train_pool_nodes=10**7,
                    rates=reference_unit_rates(), rollout_pooled=pooled,
                    colocation=colocation)


def draw(rng: random.Random, job_id: str) -> JobProfile:
    return simple_profile(job_id, rng.uniform(25, 600), rng.uniform(25, 600), rng.uniform(1.1, 2))


def time_decisions(active: int, probes: int, seed: int, pooled: bool = False,
                   colocation: bool = True) -> dict[str, float]:
    rng = random.Random(seed)
    jobs = [draw(rng, f"j{i}") for i in range(active)]
    state = place_batch(WeavePolicy(), ClusterState(capacity(pooled, colocation)), jobs,
                        ordered=False).state
    policy = WeavePolicy()
    wall, cpu = [], []
    for i in range(probes):
        job = draw(rng, f"probe{i}")
        start, start_cpu = time.perf_counter(), time.process_time()
        policy.place(state, job)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    wall.sort()
    cpu.sort()
    p99 = min(len(wall) - 1, int(0.99 * len(wall)))
    # CPU time alongside wall time: on a shared machine the wall-clock tail is mostly
    # other processes holding the cores.
    return {"active": active, "groups": len(state.groups),
            "median_ms": round(statistics.median(wall), 4), "p99_ms": round(wall[p99], 4),
            "cpu_median_ms": round(statistics.median(cpu), 4),
            "cpu_p99_ms": round(cpu[p99], 4)}


def one_by_one(jobs: list[JobProfile], cap: Capacity) -> ClusterState:
    """Arrival order, one lone arrival at a time (as the daemon places a job that
    arrives alone in its tick)."""
    policy, state = WeavePolicy(), ClusterState(cap)
    for job in jobs:
        decision = policy.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
    return state


def online_with_replacement(jobs: list[JobProfile], cap: Capacity,
                            recent: int) -> tuple[ClusterState, int]:
    """Arrival order, each arrival followed by the charged re-placement of the last
    ``recent`` arrivals (the newcomer has not started: it moves free)."""
    policy = WeavePolicy()
    state = ClusterState(cap)
    moves = 0
    admitted: list[str] = []
    for job in jobs:
        decision = policy.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
            admitted.append(job.job_id)
        plan = replace_jobs(policy, state, admitted[-recent:], free=[job.job_id])
        if plan is not None:
            state = plan.state
            moves += len(plan.pauses)
    return state, moves


def optimality(n: int, sets: int, seed: int, recent: int = 6,
               colocation: bool = True) -> dict[str, float]:
    cap = capacity(colocation=colocation)
    batch, online, replaced, moves = [], [], [], []
    for s in range(sets):
        rng = random.Random(seed * 1000 + n * 100 + s)
        jobs = [draw(rng, f"j{i}") for i in range(n)]
        best = optimum(jobs, cap).cost_per_hour
        batch_cost = place_batch(WeavePolicy(), ClusterState(cap), jobs).state.cost_per_hour
        batch.append(batch_cost / best)
        online.append(one_by_one(jobs, cap).cost_per_hour / best)
        final, moved = online_with_replacement(jobs, cap, recent)
        replaced.append(final.cost_per_hour / best)
        moves.append(moved)
    return {"jobs": n, "sets": sets,
            "mean_ratio": round(statistics.mean(batch), 4), "max_ratio": round(max(batch), 4),
            "online_mean_ratio": round(statistics.mean(online), 4),
            "online_max_ratio": round(max(online), 4),
            "replace_mean_ratio": round(statistics.mean(replaced), 4),
            "replace_max_ratio": round(max(replaced), 4),
            "moves_per_set": round(statistics.mean(moves), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--active", default="100,500,1000,2000,5000")
    ap.add_argument("--optimality", default="6,7,8")
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--sets", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recent", type=int, default=6,
                    help="arrivals re-placed together after each arrival")
    ap.add_argument("--pooled", action="store_true",
                    help="time weave's placement with pooled rollout (docs/placement.md)")
    ap.add_argument("--no-colocation", action="store_true",
                    help="without co-location as an admission option (placement and "
                    "optimum; docs/placement.md \"Co-location\")")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    colo = not args.no_colocation
    console = Console()
    results = [time_decisions(int(a), args.probes, args.seed, args.pooled, colo)
               for a in args.active.split(",") if a]
    table = Table(title="Placement time per arrival (weave policy"
                  f"{', pooled rollout' if args.pooled else ''})")
    for col in ("active jobs", "groups", "median ms", "p99 ms", "CPU median ms", "CPU p99 ms",
                "reference ms"):
        table.add_column(col, justify="right")
    for r in results:
        ref = REFERENCE_MS.get(int(r["active"]))
        table.add_row(str(r["active"]), str(r["groups"]), f"{r['median_ms']:.3f}",
                      f"{r['p99_ms']:.3f}", f"{r['cpu_median_ms']:.3f}",
                      f"{r['cpu_p99_ms']:.3f}", "-" if ref is None else f"{ref:.0f}")
    console.print(table)
    opt = [optimality(int(n), args.sets, args.seed, args.recent, colo)
           for n in args.optimality.split(",") if n]
    table = Table(title="Greedy cost / exact optimum (random sets)")
    for col in ("jobs", "sets", "batch mean", "batch max", "online mean", "online max",
                "online + re-place mean", "max", "moves / set", "reference mean"):
        table.add_column(col, justify="right")
    for o in opt:
        ref = REFERENCE_RATIO.get(int(o["jobs"]))
        table.add_row(str(o["jobs"]), str(o["sets"]), f"{o['mean_ratio']:.4f}",
                      f"{o['max_ratio']:.4f}", f"{o['online_mean_ratio']:.4f}",
                      f"{o['online_max_ratio']:.4f}", f"{o['replace_mean_ratio']:.4f}",
                      f"{o['replace_max_ratio']:.4f}", f"{o['moves_per_set']:.2f}",
                      "-" if ref is None else f"{ref:.3f}")
    console.print(table)
    if opt:
        console.print("mean over the set sizes: online "
                      f"{statistics.mean(o['online_mean_ratio'] for o in opt):.4f}, online + "
                      f"re-place {statistics.mean(o['replace_mean_ratio'] for o in opt):.4f}, "
                      f"batch {statistics.mean(o['mean_ratio'] for o in opt):.4f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "optimality": opt}, indent=2) + "\n")


if __name__ == "__main__":
    main()
