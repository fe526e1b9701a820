"""Rollout time against engine count: the width model of pooled groups, measured.

    .venv/bin/python bench/rollout_width.py [--engines 1,2,4,8] [--repeats 5] \
        [--json bench/results/rollout_width.json]

A pooled group (docs/placement.md "Pooled rollout") spreads a member's rollout over
``E`` engines; the model prices that as linear in ``E`` down to a weights-bound floor
(docs/model.md "Rollout width", ``model.perf.width_factor``). This measures it for the
built-in reference job (``builtin:grpo-toy``, ``sampling = "per_prompt"``, the only
sampling whose batch does not depend on ``E``), in two sizes:

- each engine ``r`` of ``E`` is the job's own rollout instance (``JobContext`` rank
  ``r`` of ``world_size`` ``E``) generating its share of the prompts, on one CPU
  thread, timed alone, as ``E`` devices would run them side by side (after a warm-up,
  every engine of every count once a round for ``--repeats`` rounds, each keeping its
  least time); the rollout's time on ``E`` engines is its slowest engine plus the
  merge of the shares (the critical path);
- the merged batch is checked bit-identical to the one-engine batch (what lets weaved
  pool the job at any width);
- the floor: ``T(E) = a / E + b`` fitted by least squares, ``b / T(1)`` the part no
  width removes (per-step work that does not shrink with the sequences: the weights'
  pass, Python and kernel overheads on this CPU), beside the analytic weights-bound
  floor of the shipped example jobs on the example site's H20s
  (``JobProfile.rollout_floor_fraction``). The two are different hardware: the CPU
  figure says how this job scales here, not what an H20 does.

Each size's line ``rollout_width_s = {...}`` is what a spec's ``[profile]`` takes
(docs/model.md): placement then prices the job's width from it instead of the rule.
Not measured: the TRL job (its rollout is one engine: ``workloads/trl_grpo.py`` refuses
``world_size > 1``) and vLLM (opt-in, CUDA for its sleep mode; ``bench/vllm_rollout.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.config.job import load_job
from weave_slurm.config.site import load_site
from weave_slurm.model.profile import profile_job
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.grpo_toy import GrpoToyJob

ROOT = Path(__file__).resolve().parents[1]
#: the reference job's rollout in two sizes (prompt_len: its responses' decode steps)
SIZES: dict[str, dict[str, Any]] = {
    # many sequences a step: the part that spreads over engines dominates
    "throughput": {"prompts_per_step": 64, "group_size": 8, "prompt_len": 8},
    # few sequences on a larger model: each step's pass over the weights stays
    "few-sequences": {"prompts_per_step": 16, "group_size": 2, "prompt_len": 8,
                      "hidden_size": 512, "num_layers": 4, "intermediate_size": 1024},
}


def _engine(options: dict[str, Any], rank: int, engines: int) -> GrpoToyJob:
    job = GrpoToyJob()
    job.setup(JobContext("w", Role.ROLLOUT, seed=7, rank=rank, world_size=engines,
                         options={**options, "sampling": "per_prompt", "num_threads": 1}))
    return job


def measure(options: dict[str, Any], engines: list[int], repeats: int) -> dict[str, Any]:
    """Per engine count: its engines' times, the critical path, bit-identity to E=1.
    Every engine of every count is timed once a round, ``repeats`` rounds, each keeping
    its least time (the one other processes disturbed least): a load that comes and
    goes falls on all counts alike."""
    jobs = {(e, r): _engine(options, r, e) for e in engines for r in range(e)}
    batches = {key: job.generate(0) for key, job in jobs.items()}    # warm-up
    best = dict.fromkeys(jobs, float("inf"))
    for v in range(1, repeats + 1):
        for key, job in jobs.items():
            t0 = time.perf_counter()
            batches[key] = job.generate(v)
            best[key] = min(best[key], time.perf_counter() - t0)
    rows, single = [], None
    for e in engines:
        parts = [batches[(e, r)] for r in range(e)]
        t0 = time.perf_counter()
        merged = GrpoToyJob().merge_trajectories(parts) if e > 1 else parts[0]
        merge_s = time.perf_counter() - t0
        if single is None:
            single = merged
        same = merged.tensors.keys() == single.tensors.keys() and all(
            torch.equal(merged.tensors[k], single.tensors[k]) for k in single.tensors)
        per_engine = [best[(e, r)] for r in range(e)]
        rows.append({"engines": e, "engine_s": per_engine, "merge_s": merge_s,
                     "rollout_s": max(per_engine) + merge_s, "identical_to_one": same})
    t1 = rows[0]["rollout_s"] * rows[0]["engines"]   # scaled to 1 engine if not measured
    for row in rows:
        row["factor"] = row["rollout_s"] / rows[0]["rollout_s"]
        row["linear"] = rows[0]["engines"] / row["engines"]
    a, b = _fit([r["engines"] for r in rows], [r["rollout_s"] for r in rows])
    return {"options": options, "rows": rows, "fit": {"a_s": a, "b_s": b},
            "floor_fraction": min(1.0, max(0.0, b / t1)),
            "profile_line": "rollout_width_s = {" + ", ".join(
                f"{r['engines']} = {r['rollout_s']:.4g}" for r in rows) + "}"}


def _fit(engines: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least squares of ``seconds = a / engines + b`` (``b`` at least 0)."""
    xs = [1 / e for e in engines]
    if len(xs) < 2:
        return seconds[0] * engines[0], 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(seconds)
    sxx = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, seconds, strict=True)) / sxx
    b = my - a * mx
    return (a, b) if b >= 0 else (sum(x * y for x, y in zip(xs, seconds, strict=True))
                                  / sum(x * x for x in xs), 0.0)


def analytic_floors() -> dict[str, float]:
    """The model's weights-bound floor over the rollout time, for each shipped example
    job on the shipped example site (docs/model.md "Rollout width")."""
    site = load_site(ROOT / "configs" / "site.example.toml")
    out = {}
    for path in sorted((ROOT / "configs" / "jobs").glob("*.toml")):
        spec = load_job(path)
        out[path.stem] = profile_job(spec, site).rollout_floor_fraction
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="1,2,4,8",
                        help="engine counts, comma-separated (the first is the base)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"which sizes of the job: {', '.join(SIZES)}")
    parser.add_argument("--json", type=Path, default=None, dest="json_out")
    args = parser.parse_args()
    try:
        engines = [int(x) for x in args.engines.split(",")]
    except ValueError:
        parser.error(f"--engines: comma-separated integers >= 1, got {args.engines!r}")
    if not engines or min(engines) < 1 or engines != sorted(set(engines)):
        parser.error(f"--engines: rising integers >= 1, got {args.engines!r}")
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    sizes = args.sizes.split(",")
    if unknown := [s for s in sizes if s not in SIZES]:
        parser.error(f"--sizes: unknown {unknown[0]!r}; valid: {', '.join(SIZES)}")
    console = Console(width=140)
    results = {name: measure(SIZES[name], engines, args.repeats) for name in sizes}
    table = Table(title="builtin:grpo-toy rollout over E engines (one CPU thread each, "
                        "timed alone; critical path = slowest engine + merge)")
    for col in ("size", "E", "rollout s", "x of E=1", "linear", "slowest/fastest engine",
                "merge ms", "same batch as E=1"):
        table.add_column(col, justify="right")
    for name, res in results.items():
        for row in res["rows"]:
            spread = max(row["engine_s"]) / min(row["engine_s"])
            table.add_row(name, str(row["engines"]), f"{row['rollout_s']:.4f}",
                          f"{row['factor']:.3f}", f"{row['linear']:.3f}", f"{spread:.2f}",
                          f"{row['merge_s'] * 1e3:.2f}", "yes" if row["identical_to_one"]
                          else "NO")
    console.print(table)
    floors = analytic_floors()
    for name, res in results.items():
        console.print(f"{name}: measured floor {res['floor_fraction']:.1%} of the one-engine "
                      f"time (fit T(E) = {res['fit']['a_s']:.4f}/E + {res['fit']['b_s']:.4f} s)"
                      f"; \\[profile] {res['profile_line']}")
    console.print("analytic weights-bound floor, shipped example jobs on the example site's "
                  "H20s: " + ", ".join(f"{k} {v:.1%}" for k, v in floors.items()))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(
            {"engines": engines, "repeats": args.repeats, "sizes": results,
             "analytic_floor_fraction": floors, "threads_per_engine": 1,
             "torch": torch.__version__}, indent=2) + "\n")
        console.print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
