"""Reward curve of the reference GRPO job (builtin:grpo-toy) on CPU.

    python bench/grpo_curve.py --steps 200 --out /tmp/curve [--json OUT] [--seed 0]
                               [--option key=value ...]

Runs the rollout and train roles in two objects (weights exported and imported every
step, as across pools), writes ``reward.csv`` and ``reward.png`` into ``--out``, prints
a table (reward at start/middle/end, time per phase) and writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.errors import WeaveError
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.entry import start_job

_WINDOW = 10


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--option: expected key=value, got {text!r}")
    value: Any
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def run(steps: int, seed: int, options: dict[str, Any], entry_point: str) -> dict[str, Any]:
    roll = start_job(entry_point, JobContext("curve", Role.ROLLOUT, seed, options))
    train = start_job(entry_point, JobContext("curve", Role.TRAIN, seed, options))
    rows: list[dict[str, float]] = []
    for step in range(steps):
        t0 = time.perf_counter()
        batch = roll.rollout(roll.weights_version)
        t1 = time.perf_counter()
        version = train.train(batch)
        t2 = time.perf_counter()
        roll.import_weights(train.export_weights(), version)
        t3 = time.perf_counter()
        rows.append({"step": step, "reward_mean": batch.metrics["reward_mean"],
                     "kl": train.last_train_metrics.get("kl", 0.0),
                     "rollout_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2})
    job = train.job
    params = int(getattr(job, "num_parameters", 0))
    return {"entry_point": entry_point, "seed": seed, "steps": steps, "options": options,
            "num_parameters": params, "rows": rows}


def _window(rows: list[dict[str, float]], start: int) -> float:
    part = rows[max(0, start): max(0, start) + _WINDOW]
    return statistics.fmean(r["reward_mean"] for r in part)


def summarize(result: dict[str, Any]) -> dict[str, float]:
    rows = result["rows"]
    n = len(rows)
    return {
        "reward_start": _window(rows, 0),
        "reward_middle": _window(rows, n // 2 - _WINDOW // 2),
        "reward_end": _window(rows, n - _WINDOW),
        "rollout_s_median": statistics.median(r["rollout_s"] for r in rows),
        "train_s_median": statistics.median(r["train_s"] for r in rows),
        "sync_s_median": statistics.median(r["sync_s"] for r in rows),
    }


def write_outputs(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    with (out / "reward.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    smooth = [statistics.fmean(rewards[max(0, i - _WINDOW + 1): i + 1])
              for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.35, label="reward (batch mean)")
    ax.plot(steps, smooth, label=f"reward ({_WINDOW}-step mean)")
    ax.set_xlabel("GRPO step (weight version)")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1)
    ax.set_title(f"{result['entry_point']}, seed {result['seed']}, "
                 f"{result['num_parameters'] / 1e6:.2f}M params")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=120)
    plt.close(fig)


def print_table(result: dict[str, Any], summary: dict[str, float]) -> None:
    table = Table(title=f"GRPO reward curve ({result['steps']} steps, "
                        f"{result['num_parameters'] / 1e6:.2f}M params)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.4f}" if key.startswith("reward") else f"{value * 1e3:.1f} ms")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entry-point", default="builtin:grpo-toy")
    parser.add_argument("--option", type=_parse_option, action="append", default=[],
                        help="job option key=value (JSON value), repeatable")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.steps < _WINDOW:
        parser.error(f"--steps: need at least {_WINDOW}, got {args.steps}")
    try:
        result = run(args.steps, args.seed, dict(args.option), args.entry_point)
    except WeaveError as exc:
        print(f"grpo_curve: {exc}", file=sys.stderr)
        return exc.exit_code
    summary = summarize(result)
    write_outputs(result, args.out)
    print_table(result, summary)
    if args.json is not None:
        payload = {k: v for k, v in result.items() if k != "rows"}
        payload["summary"] = summary
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
