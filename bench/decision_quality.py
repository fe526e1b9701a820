"""Decision quality across job mixes and SLOs (docs/simulator.md, "Decision quality across
mixes"; issue #35 item 3).

    .venv/bin/python bench/decision_quality.py [--jobs 200] [--days 14] [--seeds 1,2,3]
        [--mixes rollout-heavy,train-heavy,mixed,synthetic-train-heavy]
        [--slos tight,loose] [--rollout pooled|pinned] [--no-colocation] [--json OUT]

Every trace is ``weave trace generate --jobs N --days D --seed S --mix MIX --slo-dist
SLO`` (the same ``generate_trace`` call): the mixes of ``sim.generate`` (kinds chosen by
their solo rollout / training time per iteration: rollout-heavy >= 2.0, train-heavy
<= 1.25, mixed half of each; and synthetic-train-heavy, jobs without a kind whose
profiles are the reference generator's train-heavy classes, 0.125-0.5), tight SLOs
``uniform:1.0,1.2`` and loose ones ``uniform:1.5,2``, three seeds each. Each trace is
replayed in both accountings (``reference``, ``consistent``) with weave (default flags:
pooled rollout, co-location as an admission option, charged re-planning, groups <= 5;
``--rollout pinned``: whole rollout nodes, weave's default before 2026-12-07;
``--no-colocation``: without co-location), isolated and co-located on the
reference's site, and reports weave's cost against isolated, co-located and the
zero-bubble lower bound, its SLO attainment and its bubbles per pool. ``loses`` marks a
trace where weave costs more than the lower of isolated and co-located. Nothing is tuned
here: it is a baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.errors import ConfigError
from weave_slurm.placement.capacity import Capacity
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import DAY_S, GeneratorConfig, TraceMix, generate_trace
from weave_slurm.sim.policies import Accounting
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report
from weave_slurm.sim.slo import SloDistribution

GPUS = {"rollout": 8, "train": 8}
POLICIES = ("weave", "isolated", "colocated")
SLOS = {"tight": "uniform:1.0,1.2", "loose": "uniform:1.5,2"}
MIXES = (TraceMix.ROLLOUT_HEAVY, TraceMix.TRAIN_HEAVY, TraceMix.MIXED,
         TraceMix.SYNTHETIC_TRAIN_HEAVY)
ACCOUNTINGS = (Accounting.REFERENCE, Accounting.CONSISTENT)


def row(policies: dict[str, Any]) -> dict[str, Any]:
    """weave's figures on one replay, against the baselines of the same replay."""
    w, iso, colo = (policies[n] for n in POLICIES)
    best = min(iso["cost"], colo["cost"])
    return {"cost": {n: policies[n]["cost"] for n in POLICIES},
            "reference_units": {n: policies[n]["reference_units"] for n in POLICIES},
            "vs_isolated": w["ratios"]["vs_isolated"],
            "vs_colocated": w["ratios"]["vs_colocated"],
            "cost_over_bound": w["cost_over_bound"],
            "baseline_cost_over_bound": {n: policies[n]["cost_over_bound"]["total"]
                                         for n in POLICIES[1:]},
            "bound": w["bound"]["total"],
            "slo_attainment": w["slo_attainment"],
            "slo_violations": w["slo_violations"],
            "life_slo_violations": w["life_slo_violations"],
            "colocated_slo_attainment": colo["slo_attainment"],
            "bubble": w["bubble"],
            "over_best_baseline": round(w["cost"] / best, 4),
            "loses": w["cost"] > best}


def run(jobs: int, days: float, seeds: list[int], mixes: list[TraceMix],
        slos: list[str], echo: bool = True, colocation: bool = True,
        pooled: bool = True) -> dict[str, Any]:
    cap = Capacity.from_site(reference_site(), 5, pooled=pooled, colocation=colocation)
    cases: dict[str, Any] = {}
    for mix in mixes:
        for slo in slos:
            for seed in seeds:
                config = GeneratorConfig(n_jobs=jobs, arrival_window_s=days * DAY_S,
                                         seed=seed, mix=mix,
                                         slo=SloDistribution.parse(SLOS[slo], flag="--slos"))
                trace = generate_trace(config)
                for acc in ACCOUNTINGS:
                    c0 = time.process_time()
                    res = replay_policies(trace, cap, POLICIES, ReplayOptions(accounting=acc))
                    case = row(build_report(res, GPUS)["policies"])
                    case.update(mix=mix.value, slo=slo, slo_dist=SLOS[slo], seed=seed,
                                accounting=acc.value, jobs=len(trace.jobs),
                                peak_concurrent=trace.max_concurrent(),
                                cpu_s=round(time.process_time() - c0, 2))
                    name = f"{mix.value}/{slo}/{seed}/{acc.value}"
                    cases[name] = case
                    if echo:
                        print(f"{name}: {case['cpu_s']} s CPU", file=sys.stderr)
    return {"jobs": jobs, "days": days, "seeds": seeds, "policies": list(POLICIES),
            "max_group_size": 5, "site": "reference", "slos": {s: SLOS[s] for s in slos},
            "colocation": colocation, "rollout": "pooled" if pooled else "pinned",
            "cases": cases,
            "losses": [name for name, c in cases.items() if c["loses"]]}


def _choices(text: str, valid: list[str], flag: str) -> list[str]:
    picked = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in picked if v not in valid]
    if bad or not picked:
        raise ConfigError(f"{flag} {text!r}: expected a comma-separated list of "
                          f"{', '.join(valid)}")
    return picked


def _pct(share: float | None) -> str:
    """A pool's bubble in percent; '-' where weave held none of that pool (every job
    co-located: no rollout node)."""
    return "-" if share is None else f"{100 * share:.1f}%"


def print_table(out: dict[str, Any], console: Console) -> None:
    table = Table(title=f"weave vs baselines ({out['jobs']} jobs over {out['days']:g} days "
                  "per trace; ratios: baseline cost / weave's)")
    for col in ("mix", "SLO", "seed", "accounting", "vs isolated", "vs co-located",
                "cost/bound", "SLO attainment", "over SLO", "bubble r / t", "loses"):
        table.add_column(col, justify="right")
    for c in out["cases"].values():
        b = c["bubble"]
        table.add_row(c["mix"], c["slo"], str(c["seed"]), c["accounting"],
                      f"{c['vs_isolated']:.3f}x", f"{c['vs_colocated']:.3f}x",
                      f"{c['cost_over_bound']['total']:.3f}",
                      f"{100 * c['slo_attainment']:.2f}%",
                      f"{c['slo_violations']} / {c['life_slo_violations']}",
                      f"{_pct(b['rollout'])} / {_pct(b['train'])}",
                      f"{c['over_best_baseline']:.3f}x" if c["loses"] else "-")
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--days", type=float, default=14.0, help="arrival window per trace")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--mixes", default=",".join(m.value for m in MIXES))
    ap.add_argument("--slos", default=",".join(SLOS))
    ap.add_argument("--no-colocation", action="store_true",
                    help="weave without co-location as an admission option (as before it)")
    ap.add_argument("--rollout", choices=("pinned", "pooled"), default="pooled",
                    help="how weave's groups hold their rollout side (weave simulate "
                    "--rollout; pooled: weave's default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        try:
            seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            raise ConfigError(f"--seeds {args.seeds!r}: expected comma-separated integers"
                              ) from None
        mixes = [TraceMix(m) for m in _choices(args.mixes, [m.value for m in TraceMix],
                                               "--mixes")]
        slos = _choices(args.slos, list(SLOS), "--slos")
        if args.days <= 0:
            raise ConfigError(f"--days {args.days!r}: expected a positive number of days")
        c0 = time.process_time()
        out = run(args.jobs, args.days, seeds, mixes, slos,
                  colocation=not args.no_colocation, pooled=args.rollout == "pooled")
    except ConfigError as exc:
        print(f"decision_quality.py: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    out["cpu_s"] = round(time.process_time() - c0, 1)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print_table(out, Console(width=160))
    print(f"weave costs more than the lower of isolated and co-located on "
          f"{len(out['losses'])} of {len(out['cases'])}: {', '.join(out['losses']) or '-'}; "
          f"{out['cpu_s']} s CPU")


if __name__ == "__main__":
    main()
