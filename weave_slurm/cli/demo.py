"""``weave demo``: three reference GRPO jobs in one group on the embedded local backend."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from weave_slurm.errors import ConfigError

_BARS = " ▁▂▃▄▅▆▇█"


def _spark(ys: list[float]) -> str:
    return "".join(_BARS[min(8, max(0, round(y * 8)))] for y in ys[-40:])


def _live_table(rows: list[dict[str, object]], title: str) -> Table:
    table = Table(title=title)
    for col in ("JOB", "STATE", "STEP", "PHASE", "NODE", "REWARD", "RECOVERIES"):
        table.add_column(col)
    for r in rows:
        reward = r["reward"]
        table.add_row(str(r["job"]), str(r["state"]), f"{r['version']}/{r['steps']}",
                      str(r["phase"] or "-"), str(r["node"] or "-"),
                      "-" if reward is None else f"{float(str(reward)):.3f}",
                      str(r["recoveries"]))
    return table


def demo(
    steps: Annotated[int, typer.Option(help="Training steps per job.")] = 30,
    out: Annotated[Path, typer.Option(help="Directory for the PNGs and summary.json.")]
    = Path("weave-demo"),
    isolated: Annotated[bool, typer.Option(
        help="Also run each job alone, one after another, to compare.")] = True,
) -> None:
    """Run three small GRPO jobs in one group (local backend, no Slurm) and summarise."""
    from weave_slurm.runtime.demo import run_demo
    from weave_slurm.runtime.executor import GroupExecutor

    if steps < 1:
        raise ConfigError(f"--steps: must be >= 1, got {steps!r}")
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    title = ["starting"]
    last = [0.0]
    with Live(_live_table([], title[0]), console=console, refresh_per_second=4) as live:
        def on_tick(ex: GroupExecutor) -> None:
            now = time.monotonic()
            if now - last[0] > 0.25:
                last[0] = now
                live.update(_live_table(ex.status(), title[0]))

        def on_phase(text: str) -> None:
            title[0] = text
            live.update(_live_table([], text))

        result = run_demo(steps, out, isolated=isolated, on_tick=on_tick, on_phase=on_phase)
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
    console.print(f"Gantt chart: {result.gantt}\nreward curves: {result.curves}\n"
                  f"summary: {result.summary}")
