"""``weave simulate`` (trace replay) and ``weave trace generate`` (synthetic traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from weave_slurm.config.site import SiteConfig, load_site
from weave_slurm.errors import ConfigError
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.pooled import RolloutSharing
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.drift import DriftModel, DriftPattern
from weave_slurm.sim.execution import GroupExecution, RolloutModel
from weave_slurm.sim.failures import FailureModel
from weave_slurm.sim.generate import GeneratorConfig, TraceMix, generate_trace
from weave_slurm.sim.loader import load_trace, save_trace
from weave_slurm.sim.plots import plot_all
from weave_slurm.sim.policies import (
    Accounting,
    SimPolicy,
    StalenessMix,
    parse_policies,
    refuse_pooled,
)
from weave_slurm.sim.profiles import load_profile_table
from weave_slurm.sim.replay import ReplayOptions, ReplayResult, replay_policies
from weave_slurm.sim.report import build_report, render
from weave_slurm.sim.slo import REFERENCE_SLO_SEED, SloDistribution
from weave_slurm.sim.traces import Trace

trace_app = typer.Typer(help="Synthetic traces.", no_args_is_help=True)


def simulate(
    trace: Annotated[str, typer.Argument(help="Trace file, or a packaged name: wild, "
                                              "philly_0_30000_20_parsed_all, ...")] = "wild",
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="profile.json for kinds (default: the packaged copy).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="wild, philly, philly-parsed or "
                                            "toml (default: detected).")] = None,
    site: Annotated[Path | None, typer.Option("--site", help="Site TOML (default: the "
                                              "reference's accounting).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="Comma-separated policies.")
                      ] = "weave,isolated,colocated",
    max_group_size: Annotated[int | None, typer.Option(min=1, max=16)] = None,
    accounting: Annotated[str, typer.Option(help="reference or consistent.")] = "reference",
    seed: Annotated[int, typer.Option(help="Seed of SLO draws and random choices.")
                    ] = REFERENCE_SLO_SEED,
    slo_dist: Annotated[str, typer.Option("--slo-dist", help="SLOs for jobs without one: "
                                          "uniform:LOW,HIGH or fixed:V.")] = "uniform:1.1,2",
    rollout_mean: Annotated[float, typer.Option(help="Expected rollout phase / max-token "
                                                "bound (consistent accounting).")] = 1.0,
    failure_rate: Annotated[float, typer.Option(help="Node failures per node-hour.")] = 0.0,
    migration_s: Annotated[float, typer.Option(
        "--migration-s", min=0, help="Restart pause of a moved job, on top of copying its "
        "warm state over the site's intra-pool links; charged to the job.")
                           ] = ReplayOptions.migration_s,
    recent_jobs: Annotated[int, typer.Option(
        "--recent-jobs", min=0, help="weave: re-place this many recent arrivals together "
        "with each new one when that pays (0: off).")] = ReplayOptions.recent_jobs,
    replan_interval_h: Annotated[float, typer.Option(
        "--replan-interval-h", min=0, help="weave: hours between charged re-plans of the "
        "least efficient groups (0: off).")] = ReplayOptions.replan_interval_s / 3600,
    drift: Annotated[str | None, typer.Option(help="increasing, decreasing or mixed.")] = None,
    staleness_mix: Annotated[str, typer.Option(
        "--staleness-mix", help="FRACTION:K: that fraction of jobs (drawn per job) declares "
        "staleness K, e.g. 0.3:1.")] = "0:1",
    rollout: Annotated[str | None, typer.Option(
        "--rollout", help="How weave's groups hold their rollout side: pinned (whole "
        "nodes) or pooled (GPUs every member's rollout spans in turn; docs/placement.md; "
        "weave-live: rows of GPU shares as weaved holds them, its \\[limits] rollout = "
        "\"pooled\"). Default: pooled for weave; weave-live as weaved, the site's "
        "\\[limits] rollout; pinned for the others (docs/simulator.md).")] = None,
    colocation: Annotated[bool | None, typer.Option(
        "--colocation/--no-colocation", help="Whether weave may admit a job co-located "
        "(its rollout on its own training nodes; docs/placement.md). Default: the site's "
        "\\[limits] colocation, else on; weave-live as weaved: the site's, else off, "
        "and with weaved's rules (co-located groups closed, running jobs re-planned "
        "without co-location, no job of more than one training rank on a \\[runtime] "
        "gangs site: docs/simulator.md).")
                          ] = None,
    verify: Annotated[bool, typer.Option(help="Event-level SLO check of grouped policies.")
                      ] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")
                        ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write PNG plots here.")] = None,
) -> None:
    """Replay a trace under placement policies and compare their cost, SLOs and usage."""
    site_cfg = load_site(site) if site is not None else reference_site()
    names = parse_policies(policy)
    acc = Accounting.parse(accounting)
    pooled = {n: _pooled(rollout, site_cfg.limits.rollout, n) for n in names}
    if rollout is not None and any(pooled.values()):
        refuse_pooled(names, site_cfg.runtime.gangs)   # before any replay runs
    if not 0 < rollout_mean <= 1:
        raise ConfigError(f"--rollout-mean {rollout_mean!r}: expected a fraction in (0, 1]")
    tr = load_trace(trace, fmt=fmt, slo=SloDistribution.parse(slo_dist, flag="--slo-dist"),
                    seed=seed, profiles=load_profile_table(profile) if profile else None)
    if not tr.jobs:
        raise ConfigError(f"trace {trace!r} has no jobs")
    options = ReplayOptions(
        accounting=acc, max_group_size=max_group_size, seed=seed,
        rollout_mean_fraction=rollout_mean, migration_s=migration_s,
        recent_jobs=recent_jobs, replan_interval_s=replan_interval_h * 3600,
        staleness=StalenessMix.parse(staleness_mix, seed),
        failures=FailureModel(failure_rate, seed=seed) if failure_rate > 0 else None,
        drift=DriftModel(DriftPattern.parse(drift), seed=seed) if drift else None,
        gang_gpus=site_cfg.train.gpus_per_node if site_cfg.runtime.gangs else None)
    caps = {n: Capacity.from_site(site_cfg, max_group_size, pooled=pooled[n],
                                  colocation=_colocation(colocation, site_cfg.limits.colocation,
                                                         SimPolicy.make(n).weaved_moves))
            for n in names}
    cap = caps[names[0]]
    results = _run(tr, caps, options)
    gpus = {"rollout": site_cfg.rollout.gpus_per_node, "train": site_cfg.train.gpus_per_node}
    grouped = tuple(n for n in names if n not in ("isolated", "colocated"))
    report = build_report(results, gpus, grouped if verify else ())
    report["trace"] = {"source": tr.source, "jobs": len(tr.jobs), "span_h": tr.end_s / 3600}
    report["site"] = {"name": site_cfg.name, "currency": site_cfg.currency,
                      "max_group_size": cap.max_group_size,
                      "rollout": {n: "pooled" if r.capacity.rollout_pooled else "pinned"
                                  for n, r in results.items()},
                      "colocation": {n: r.capacity.colocation for n, r in results.items()}}
    render(report["policies"], site_cfg.currency, Console())
    if json_out is not None:
        _write_json(json_out, report)
    if plot is not None:
        _plot(results, plot, site_cfg, gpus)


def _pooled(flag: str | None, site: str, policy: str) -> bool:
    """Whether a policy's groups may pool rollout GPUs: ``--rollout`` where given, else
    pooled for ``weave`` (not worse than pinned on any shipped trace in either
    accounting: docs/simulator.md "Pooled rollout"), the site's ``[limits] rollout`` for
    ``weave-live`` (weaved's own setting: pooled where ``[runtime] gangs`` is on), pinned
    for the other policies (``weave-online`` pooled is dearer than pinned in the
    reference accounting)."""
    if flag is not None:
        return RolloutSharing.parse(flag) is RolloutSharing.POOLED
    if SimPolicy.make(policy).weaved_moves:
        return RolloutSharing.parse(site, "[limits] rollout") is RolloutSharing.POOLED
    return policy == "weave"


def _colocation(flag: bool | None, site: bool | None, weaved: bool) -> bool:
    """Whether a policy may co-locate: ``--colocation``/``--no-colocation`` where given,
    else the site's ``[limits] colocation``; unset, weave's default is on and weaved's
    (``weave-live``) off, as weaved (daemon/colocating.py)."""
    if flag is not None:
        return flag
    return bool(site) if weaved else site is not False


def _run(tr: Trace, caps: dict[str, Capacity], options: ReplayOptions
         ) -> dict[str, ReplayResult]:
    """Each policy replayed on its own capacity (``caps``, in order)."""
    span = max(tr.end_s, 1.0)
    with Progress(transient=True) as bar:
        tasks = {n: bar.add_task(f"replaying {n}", total=span) for n in caps}

        def tick(name: str, now_s: float) -> None:
            bar.update(tasks[name], completed=min(now_s, span))

        out: dict[str, ReplayResult] = {}
        for name, cap in caps.items():
            out |= replay_policies(tr, cap, (name,), options, tick)
        return out


def _write_json(path: Path, report: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write: {exc.strerror}") from None


def _plot(results: dict[str, ReplayResult], out: Path, site: SiteConfig,
          gpus: dict[str, int]) -> None:
    gantt = None
    for res in results.values():
        if res.segments:
            seg = max(res.segments, key=lambda s: (s.group.size, s.end_s - s.start_s))
            if seg.group.size > 1:
                gantt = GroupExecution(seg.group, RolloutModel(0.85, 0.1), migration=True,
                                       seed=0).run(meta_iterations=4)
                break
    for path in plot_all(results, gantt, out, site.currency, gpus):
        typer.echo(f"wrote {path}")


@trace_app.command("generate")
def generate(
    out: Annotated[Path, typer.Argument(help="Output trace file (.toml, or --format).")],
    jobs: Annotated[int, typer.Option("--jobs", min=1)] = 200,
    days: Annotated[float, typer.Option(help="Arrival window in days.")] = 14.0,
    seed: Annotated[int, typer.Option()] = 0,
    mix: Annotated[TraceMix, typer.Option(
        "--mix", help="Kinds drawn: wild (wild.trace's counts), rollout-heavy (solo "
        "rollout / training >= 2), train-heavy (<= 1.25), mixed (half each) or "
        "synthetic-train-heavy (no kind; 0.125-0.5; docs/traces.md).")] = TraceMix.WILD,
    slo_dist: Annotated[str, typer.Option(
        "--slo-dist", help="SLOs: uniform:LOW,HIGH or fixed:V, e.g. uniform:1.0,1.2 "
        "(tight) or uniform:1.5,2 (loose).")] = "uniform:1,2",
    fmt: Annotated[str, typer.Option("--format", help="toml, wild or philly-parsed.")
                   ] = "toml",
) -> None:
    """Generate a trace shaped like the paper's production mix (or another --mix)."""
    if days <= 0:
        raise ConfigError(f"--days {days!r}: expected a positive number of days")
    slo = SloDistribution.parse(slo_dist, flag="--slo-dist")
    trace = generate_trace(GeneratorConfig(n_jobs=jobs, arrival_window_s=days * 86400.0,
                                           seed=seed, mix=mix, slo=slo))
    save_trace(trace, out, fmt)
    typer.echo(f"wrote {out}: {len(trace.jobs)} jobs over {trace.end_s / 86400:.2f} days")
