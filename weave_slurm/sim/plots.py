"""PNG plots of a replay: cost rate and pool usage over time, one group's Gantt chart.

matplotlib is imported inside the functions (no work at import time) with the
non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError
from weave_slurm.sim.execution import ExecutionResult
from weave_slurm.sim.replay import ReplayResult
from weave_slurm.vocab import Phase

HOUR_S = 3600.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _steps(series: list[tuple[float, float, int, float]], col: int, start_s: float
           ) -> tuple[list[float], list[float]]:
    xs = [(row[0] - start_s) / HOUR_S for row in series]
    ys = [float(row[col]) for row in series]
    return xs, ys


def plot_all(results: Mapping[str, ReplayResult], gantt: ExecutionResult | None, out_dir: Path,
             currency: str, gpus_per_node: Mapping[str, int]) -> list[Path]:
    """Write cost_rate.png, gpus.png and (with ``gantt``) gantt.png into ``out_dir``."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plot {out_dir}: cannot create directory: {exc.strerror}") from None
    plt = _pyplot()
    written = []
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, res in results.items():
        xs, ys = _steps(res.series, 3, res.start_s)
        ax.step(xs, ys, where="post", label=name, linewidth=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel(f"cost rate ({currency}/h)")
    ax.legend()
    ax.grid(alpha=0.3)
    path = out_dir / "cost_rate.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for pool_idx, (pool, ax) in enumerate(zip(("rollout", "train"), axes, strict=True)):
        for name, res in results.items():
            xs, ys = _steps(res.series, 1 + pool_idx, res.start_s)
            ax.step(xs, [y * gpus_per_node[pool] for y in ys], where="post", label=name,
                    linewidth=1)
        ax.set_ylabel(f"{pool} GPUs in use")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[1].set_xlabel("time (h)")
    path = out_dir / "gpus.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    if gantt is not None and gantt.records:
        written.append(plot_gantt(gantt, out_dir / "gantt.png"))
    return written


def plot_gantt(run: ExecutionResult, path: Path, max_phases: int = 60) -> Path:
    """Which member is in which phase on which pool (rows: pool nodes)."""
    plt = _pyplot()
    records = sorted(run.records, key=lambda r: r.start_s)[:max_phases]
    jobs = sorted({r.job_id for r in records})
    colors = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
    rows: dict[tuple[Phase, int], int] = {}
    for r in records:
        for node in r.nodes:
            rows.setdefault((r.phase, node), 0)
    ordered = sorted(rows, key=lambda k: (k[0] != Phase.ROLLOUT, k[1]))
    for idx, key in enumerate(ordered):
        rows[key] = idx
    fig, ax = plt.subplots(figsize=(11, 1 + 0.5 * len(rows)))
    for r in records:
        for node in r.nodes:
            y = rows[(r.phase, node)]
            ax.barh(y, r.released_s - r.start_s, left=r.start_s, color=colors[r.job_id],
                    edgecolor="black", linewidth=0.4)
            if r.end_s > r.released_s:  # migrated long tail
                ax.barh(y, r.end_s - r.released_s, left=r.released_s, height=0.25,
                        color=colors[r.job_id], alpha=0.6)
    ax.set_yticks(range(len(ordered)))
    ax.set_yticklabels([f"{'h20' if p is Phase.ROLLOUT else 'h800'} node {n}"
                        for p, n in ordered])
    ax.set_xlabel("time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[j]) for j in jobs]
    ax.legend(handles, jobs, loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
