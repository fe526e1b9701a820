"""What `weave simulate` prints and writes: per-policy figures and ratios (pure + rich)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.placement.group import Group
from weave_slurm.sim.bound import ratios as bound_ratios
from weave_slurm.sim.execution import check_slo
from weave_slurm.sim.replay import JobRun, ReplayResult

BASELINES = ("isolated", "colocated")
POOLS = ("rollout", "train")


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


def summarize(res: ReplayResult, gpus_per_node: Mapping[str, int]) -> dict[str, Any]:
    """One policy's figures (the `--json` schema of docs/simulator.md)."""
    span_s = max(res.end_s - res.start_s, 1e-9)
    runs = list(res.runs.values())
    alive = [(r, (r.departure_s if r.departure_s is not None else res.end_s) - r.arrival_s)
             for r in runs]
    total_alive = sum(a for _, a in alive)
    violated_s = sum(r.violated_s for r in runs)
    slowdowns = [r.slowdown_s / a for r, a in alive if a > 0]
    n_arrivals = max(len(runs), 1)
    adm = dict(res.admissions)
    place_ms = sorted(1000 * s for s in res.placement_s)
    iterations = sum(r.done for r in runs)
    out: dict[str, Any] = {
        "policy": res.policy, "accounting": res.accounting.value,
        "cost": _r(res.cost, 2), "cost_per_hour": _r(res.cost * 3600 / span_s, 2),
        "reference_units": _r(res.reference_units, 2),
        "span_h": _r(span_s / 3600, 3),
        "jobs": len(runs),
        "slo_violations": sum(1 for r in runs if r.ever_violated),
        # Mean iteration time over the whole life, pauses for moves included.
        "life_slo_violations": sum(1 for r, a in alive if _life_over_slo(r, a)),
        "slo_attainment": _r(1 - violated_s / total_alive) if total_alive else 1.0,
        "admissions": adm,
        "admissions_pct": {k: _r(100 * v / n_arrivals, 2) for k, v in adm.items()},
        "bubble": {p: _r(1 - res.busy_node_s[p] / res.node_s[p]) if res.node_s.get(p) else None
                   for p in POOLS},
        "peak_nodes": {p: _r(n, 3) for p, n in res.peak_nodes.items()},
        "peak_gpus": {p: round(res.peak_nodes[p] * gpus_per_node[p]) for p in POOLS},
        "mean_nodes": {p: _r(res.node_s[p] / span_s, 3) for p in POOLS},
        "mean_gpus": {p: _r(res.node_s[p] / span_s * gpus_per_node[p], 2) for p in POOLS},
        "slowdown": {"mean": _r(sum(slowdowns) / len(slowdowns)) if slowdowns else 1.0,
                     "max": _r(max((r.max_slowdown for r in runs), default=1.0))},
        "placement_ms": {"mean": _r(sum(place_ms) / len(place_ms), 3) if place_ms else 0.0,
                         "max": _r(place_ms[-1], 3) if place_ms else 0.0},
        "iterations": _r(iterations, 1),
        "cost_per_iteration": _r(res.cost / iterations, 6) if iterations else None,
        "migrations": res.migrations, "repins": res.repins, "replans": res.replans,
        "pause_h": _r(sum(r.paused_s for r in runs) / 3600, 3),
        "refusals": res.refusals, "failures": res.failures,
        "lost_iterations": _r(sum(r.lost_iterations for r in runs), 2),
        "regroups": res.regroups, "optimum_fallback_intervals": res.optimum_fallbacks,
    }
    out.update(_bound_figures(res))
    out.update({k: _r(v) for k, v in res.extra.items()})
    return out


def _bound_figures(res: ReplayResult) -> dict[str, Any]:
    """The zero-bubble bound and the policy's cost over it (overall, per pool, and over
    the busy cost of the iterations it completed)."""
    bound = res.bound
    if bound is None:
        return {}
    rates = res.capacity.rates
    pool_cost = None if res.policy == "optimal" else {
        p: res.node_s.get(p, 0.0) * rates.price(p) / 3600.0 for p in POOLS}
    delivered = bound.delivered({j: r.done for j, r in res.runs.items()}, rates)
    over = bound_ratios(res.cost, pool_cost, bound, delivered)
    return {"bound": {"total": _r(bound.total, 2), **{p: _r(bound.pools[p], 2) for p in POOLS},
                      "reference_units": _r(bound.reference_units, 2)},
            "pool_cost": None if pool_cost is None else {p: _r(c, 2)
                                                         for p, c in pool_cost.items()},
            "cost_over_bound": {k: None if v is None else _r(v) for k, v in over.items()}}


def _life_over_slo(run: JobRun, alive_s: float) -> bool:
    """The job's life (pauses for moves included) exceeds ``slo x`` the time its
    iterations would have taken alone, at the phase times they had (only jobs that
    completed something are judged)."""
    if run.done <= 0 or alive_s <= 0:
        return False
    return alive_s > run.actual.slo * run.solo_done_s * (1 + 1e-9)


def segments_by_job(res: ReplayResult) -> dict[str, list[tuple[Group, float]]]:
    out: dict[str, list[tuple[Group, float]]] = {}
    for seg in res.segments:
        for job_id in seg.group.job_ids:
            out.setdefault(job_id, []).append((seg.group, seg.end_s - seg.start_s))
    return out


def verify_slo(res: ReplayResult, window: int = 100) -> dict[str, Any]:
    """Event-level check of the SLOs the placement model promised (docs/simulator.md):
    every job's measured mean iteration time over ``slo x solo``; ``steady`` lets each
    group's schedule carry over a membership change, ``cold_restart`` restarts it."""
    segs = segments_by_job(res)
    budgets = {j: res.runs[j].actual.slo * res.runs[j].actual.solo_s for j in segs}
    out: dict[str, Any] = {"window_meta_iterations": window}
    for label, warm in (("steady", True), ("cold_restart", False)):
        c = check_slo(segs, budgets, window, warm)
        out[label] = {"worst_ratio": _r(c.worst, 5), "jobs_at_or_over": c.over, "jobs": c.jobs}
    return out


def build_report(results: Mapping[str, ReplayResult], gpus_per_node: Mapping[str, int],
                 verify: tuple[str, ...] = (), window: int = 100) -> dict[str, Any]:
    """The `--json` document: ``{"policies": {NAME: {...}}}``."""
    summaries = {name: summarize(res, gpus_per_node) for name, res in results.items()}
    add_ratios(summaries)
    for name in verify:
        if name in results and results[name].segments:
            summaries[name]["slo_check"] = verify_slo(results[name], window)
    return {"policies": summaries}


def add_ratios(summaries: dict[str, dict[str, Any]]) -> None:
    """Cost-efficiency ratios: a baseline's cost over the policy's (higher is better).

    In consistent accounting jobs may run longer, so the ratio is also given per
    completed iteration (``cost_per_iteration``)."""
    for s in summaries.values():
        ratios: dict[str, float | None] = {}
        for base in BASELINES:
            b = summaries.get(base)
            if b is None or base == s["policy"]:
                continue
            ratios[f"vs_{base}"] = _r(b["cost"] / s["cost"]) if s["cost"] else None
            if b.get("cost_per_iteration") and s.get("cost_per_iteration"):
                ratios[f"vs_{base}_per_iteration"] = _r(b["cost_per_iteration"]
                                                        / s["cost_per_iteration"])
        s["ratios"] = ratios


def _ratio_cell(s: Mapping[str, Any], key: str) -> str:
    value = (s.get("cost_over_bound") or {}).get(key)
    return "-" if value is None else f"{value:.3f}"


def render(summaries: Mapping[str, Mapping[str, Any]], currency: str, console: Console) -> None:
    """One column per policy, one row per figure."""
    table = Table(title=f"weave simulate ({next(iter(summaries.values()))['accounting']} "
                        f"accounting)" if summaries else "weave simulate")
    table.add_column("figure")
    for name in summaries:
        table.add_column(name, justify="right")

    def row(label: str, fn: Any) -> None:
        table.add_row(label, *[fn(s) for s in summaries.values()])

    row(f"total cost ({currency})", lambda s: f"{s['cost']:,.0f}")
    row(f"cost per hour ({currency})", lambda s: f"{s['cost_per_hour']:,.1f}")
    row("h800-node-seconds (ref. units)", lambda s: f"{s['reference_units']:,.0f}")
    for base in BASELINES:
        row(f"cost efficiency vs {base}",
            lambda s, b=base: f"{s['ratios'][f'vs_{b}']:.3f}x"
            if s["ratios"].get(f"vs_{b}") else "-")
    row("cost / zero-bubble bound", lambda s: _ratio_cell(s, "total"))
    for pool in POOLS:
        row(f"cost / bound {pool}", lambda s, p=pool: _ratio_cell(s, p))
    row("SLO attainment (job-time)", lambda s: f"{100 * s['slo_attainment']:.2f}%")
    row("jobs ever over SLO", lambda s: str(s["slo_violations"]))
    row("jobs over SLO over their life", lambda s: str(s["life_slo_violations"]))
    for kind in ("direct", "scale_rollout", "new_group", "colocated"):
        row(f"admitted {kind} (% arrivals)",
            lambda s, k=kind: f"{s['admissions_pct'].get(k, 0):.1f}%")
    for pool in POOLS:
        row(f"bubble {pool}", lambda s, p=pool: "-" if s["bubble"][p] is None
            else f"{100 * s['bubble'][p]:.1f}%")
        row(f"GPUs {pool} peak / mean",
            lambda s, p=pool: f"{s['peak_gpus'][p]} / {s['mean_gpus'][p]:.0f}")
    row("slowdown mean / max",
        lambda s: f"{s['slowdown']['mean']:.3f} / {s['slowdown']['max']:.3f}")
    row("placement per arrival (ms)",
        lambda s: f"{s['placement_ms']['mean']:.2f} (max {s['placement_ms']['max']:.1f})")
    row("iterations completed", lambda s: f"{s['iterations']:,.0f}")
    row("moves / re-pins / pause h", lambda s: f"{s['migrations']} / {s['repins']} / "
        f"{s['pause_h']:.1f}")
    row("failures", lambda s: str(s["failures"]))
    console.print(table)
