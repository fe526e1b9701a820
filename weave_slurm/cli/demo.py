"""``weave demo``: three reference GRPO jobs through weaved on the embedded local backend."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from weave_slurm.cli.logs import setup_logging
from weave_slurm.errors import ConfigError

if TYPE_CHECKING:
    from weave_slurm.apps.demo import DemoResult

_BARS = " ▁▂▃▄▅▆▇█"


def _spark(ys: list[float]) -> str:
    return "".join(_BARS[min(8, max(0, round(y * 8)))] for y in ys[-40:])


def _live_table(rows: list[dict[str, object]], title: str) -> Table:
    """The jobs as ``weave status`` shows them (from weaved's socket)."""
    table = Table(title=title)
    for col in ("JOBID", "NAME", "GROUP", "STATE", "PHASE", "ITER", "SLOWDOWN/SLO", "NODES"):
        table.add_column(col)
    for r in rows:
        sd = r.get("slowdown")
        slo = r.get("slo")
        mark = "!" if r.get("slo_ok") is False else ""
        nodes = r.get("nodes") or []
        table.add_row(str(r["job"]), str(r["name"]), str(r.get("group") or "-"),
                      str(r["state"]), str(r.get("phase") or "-"), str(r.get("iter") or "-"),
                      f"{'-' if sd is None else f'{float(str(sd)):.2f}'}/"
                      f"{'-' if slo is None else f'{float(str(slo)):.2f}'}{mark}",
                      ",".join(str(n) for n in nodes) if isinstance(nodes, list) else "-")
    return table


def demo(
    steps: Annotated[int, typer.Option(help="Training steps per job.")] = 20,
    out: Annotated[Path, typer.Option(help="Directory for the PNGs and summary.json.")]
    = Path("weave-demo"),
    isolated: Annotated[bool, typer.Option(
        help="Also run each job alone, one after another, to compare.")] = True,
) -> None:
    """Start weaved (local backend, no Slurm), submit three small GRPO jobs, summarise."""
    if steps < 1:
        raise ConfigError(f"--steps: must be >= 1, got {steps!r}")
    setup_logging(logging.WARNING, "weave demo")
    console = Console()
    if console.is_terminal:
        result = _run_live(console, steps, out, isolated)
    else:                       # CI, a pipe, a log file: plain lines as things change
        result = _run_plain(steps, out, isolated)
    rewards = Table(title="reward per job (grouped run)")
    for col in ("JOB", "FIRST", "LAST", "CURVE"):
        rewards.add_column(col)
    for job, ys in result.rewards.items():
        rewards.add_row(job, f"{ys[0]:.3f}", f"{ys[-1]:.3f}", _spark(ys))
    console.print(rewards)
    pools = Table(title="pools over the steady window (all first rollouts done -> end; "
                  "model builds excluded)")
    for col in ("RUN", "WALL_S", "H20_BUSY", "H800_BUSY"):
        pools.add_column(col)
    runs = [("grouped", result.grouped)]
    if result.isolated is not None:
        runs.append(("isolated (one after another, measured)", result.isolated))
    for name, st in runs:
        pools.add_row(name, f"{st.wall_s:.1f}", f"{st.rollout_busy:.1%}",
                      f"{st.train_busy:.1%}")
    console.print(pools)
    if result.usage:   # what weave sacct lists for these jobs
        from weave_slurm.cli.sacct import DEFAULT_FORMAT, parse_format, render

        now = max(r["updated_s"] or 0.0 for r in result.usage)
        console.print("usage, as `weave sacct` lists it (each member's share of its "
                      "group's GPU-hours and cost):")
        typer.echo("\n".join(render([{**r, "now": now} for r in result.usage],
                                     parse_format(DEFAULT_FORMAT))))
    console.print(f"Gantt chart: {result.gantt}\nreward curves: {result.curves}\n"
                  f"busy pools: {result.busy}\nsummary: {result.summary}")


def _run_live(console: Console, steps: int, out: Path, isolated: bool) -> DemoResult:
    """On a terminal: one live table, redrawn."""
    from weave_slurm.apps.demo import run_demo

    title = ["starting"]
    last = [0.0]
    with Live(_live_table([], title[0]), console=console, refresh_per_second=4) as live:
        def on_status(rows: list[dict[str, object]]) -> None:
            now = time.monotonic()
            if now - last[0] > 0.25:
                last[0] = now
                live.update(_live_table(rows, title[0]))

        def on_phase(text: str) -> None:
            title[0] = text
            live.update(_live_table([], text))

        return run_demo(steps, out, isolated=isolated, on_status=on_status,
                        on_phase=on_phase)


def _run_plain(steps: int, out: Path, isolated: bool) -> DemoResult:
    """Without a terminal: a line for each stage, and one for each job whose state or
    ITER changed (flushed at once, so a CI log shows progress as it happens)."""
    from weave_slurm.apps.demo import run_demo

    t0 = time.monotonic()
    seen: dict[object, tuple[object, object]] = {}

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {text}", flush=True)

    def on_status(rows: list[dict[str, object]]) -> None:
        for r in rows:
            now = (r["state"], r.get("iter"))
            if seen.get(r["job"]) != now:
                seen[r["job"]] = now
                say(f"job {r['job']} {r['name']}: {r['state']} ITER {r.get('iter') or '-'}"
                    f" group {r.get('group') or '-'}")

    return run_demo(steps, out, isolated=isolated, on_status=on_status, on_phase=say)
