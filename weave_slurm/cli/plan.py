"""``weave plan``: place job specs on a site and compare with the baselines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from weave_slurm.cli.status import share
from weave_slurm.config.job import load_job
from weave_slurm.config.site import SiteConfig, default_site, load_site
from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import profile_job
from weave_slurm.placement.baselines import POLICIES
from weave_slurm.placement.pooled import RolloutSharing
from weave_slurm.placement.summary import plan_summary

PLAN_POLICIES = ("weave", "isolated", "colocated")


def load_site_or_default(site: Path | None) -> SiteConfig:
    return load_site(site) if site is not None else default_site()


def plan(
    jobs: Annotated[list[Path], typer.Argument(help="Job spec TOML files.")],
    site: Annotated[Path | None, typer.Option("--site", help="Site config TOML.")] = None,
    policy: Annotated[str, typer.Option(help="weave, isolated or colocated.")] = "weave",
    max_group_size: Annotated[int | None, typer.Option(min=1, help="Override the site's "
                                                       "limits.max_group_size.")] = None,
    rollout: Annotated[str | None, typer.Option(
        "--rollout", help="weave's groups: pinned (whole rollout nodes, each member pinned "
        "to some) or pooled (rollout GPUs every member spans in turn; docs/placement.md). "
        "Default: the site's \\[limits] rollout, as weaved runs them.")
                       ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON here.")] = None,
) -> None:
    """Show the groups, slowdowns, bubbles, GPUs per pool and cost against the baselines."""
    if policy not in PLAN_POLICIES:
        sim_only = ", ".join(sorted(set(POLICIES) - set(PLAN_POLICIES)))
        raise ConfigError(f"--policy '{policy}': valid choices: {', '.join(PLAN_POLICIES)}"
                          f" (the simulator also has: {sim_only})")
    site_cfg = load_site_or_default(site)
    pooled = RolloutSharing.parse(rollout or site_cfg.limits.rollout) is RolloutSharing.POOLED
    specs = [load_job(p) for p in jobs]
    seen: dict[str, str] = {}
    profiles = []
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"{spec.source}: key 'name' = '{spec.name}' is already used by "
                              f"{seen[spec.name]}; job names must be unique in one plan")
        seen[spec.name] = spec.source
        profiles.append(profile_job(spec, site_cfg))
    summary = plan_summary(site_cfg, profiles, policy, max_group_size, pooled)
    text = json.dumps(summary, indent=2, sort_keys=True)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        typer.echo(text)
    else:
        render(summary, table_console())


def table_console() -> Console:
    """A console for tables: the terminal's width, or every column in full when the
    output is piped or redirected (rich would cut it to 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=_PIPED_WIDTH)


#: Wide enough for any plan table: piped output is never wrapped or cut.
_PIPED_WIDTH = 1000


def render(s: dict[str, Any], console: Console) -> None:
    cur = s["currency"]
    r_part, t_part = (s["pools"][k]["partition"] for k in ("rollout", "train"))
    jobs = Table(title=f"Jobs ({s['policy']} placement on site '{s['site']}')")
    for col in ("JOB", "USER", "GROUP", "ADMISSION", "SOLO s", "TURNS", "SLOWDOWN/SLO",
                "R/T NODES"):
        jobs.add_column(col, justify="right" if col.endswith(("s", "SLO", "TURNS")) else "left")
    for j in s["jobs"]:
        mark = "" if j["within_slo"] else " [red]VIOLATED[/red]"
        jobs.add_row(j["job"], j["user"], str(j["group"]), j["admission"], f"{j['solo_s']:.0f}",
                     str(j["turns"]), f"{j['slowdown']:.2f}/{j['slo']:.2f}{mark}",
                     f"{j['rollout_nodes']}/{j['train_nodes']}")
    console.print(jobs)
    groups = Table(title="Groups")
    for col in ("GROUP", "MEMBERS", "ROLLOUT NODES", "TRAIN NODES", "PERIOD s",
                f"BUBBLE {r_part}", f"BUBBLE {t_part}", f"{cur}/h"):
        groups.add_column(col)
    for g in s["groups"]:
        rb = share(g["rollout_bubble"])
        pool = f" ({g['pool_gpus']} GPUs)" if g.get("pool_gpus") else ""
        groups.add_row(str(g["group"]), ",".join(g["members"]), f"{g['rollout_nodes']:g}{pool}",
                       str(g["train_nodes"]), f"{g['period_s']:.0f}", rb,
                       share(g["train_bubble"]), f"{g['cost_per_hour']:.2f}")
    console.print(groups)
    cost = Table(title="Cost against the baselines")
    # RATIO compares cost per job-hour (what a job's progress costs), not per hour: a
    # placement with fewer GPUs but slower jobs can cost less per hour and more per job
    for col in ("POLICY", f"{r_part} GPUs", f"{t_part} GPUs", f"{cur}/h", f"{cur}/job-hour",
                "RATIO (per job-hour)"):
        cost.add_column(col)
    cost.add_row(s["policy"], str(s["pools"]["rollout"]["gpus"]), str(s["pools"]["train"]["gpus"]),
                 f"{s['cost_per_hour']:.2f}", _num(s["cost_per_job_hour"]), "1.00x")
    for name, b in s["baselines"].items():
        ratio = s["cost_per_job_hour_ratio"].get(f"vs_{name}")
        cost.add_row(name, str(b["pools"]["rollout"]["gpus"]), str(b["pools"]["train"]["gpus"]),
                     f"{b['cost_per_hour']:.2f}", _num(b["cost_per_job_hour"]),
                     f"{ratio:.2f}x" if ratio else "-")
    console.print(cost)
    for r in s["refused"]:
        console.print(f"[yellow]not placed[/yellow] {r['job']}: {'; '.join(r['reasons'])}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
