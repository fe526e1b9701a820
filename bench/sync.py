"""Benchmark: two-tier weight sync vs naive pull and flat broadcast, and delta mode.

Runs real rank processes (gloo) in two network namespaces joined by a veth pair shaped
to ``--rate-mbit`` in both directions (needs root, iproute2, tc). The ideal time of a
sync is its slow-link bytes over the MEASURED link rate: one big gloo send (1-to-1)
across the shaped veth, measured before the matrix and again after it. Every
configuration runs ``--reps`` syncs in one process group; the median is reported.
Prints rich tables and writes JSON with ``--json OUT``.

    .venv/bin/python bench/sync.py --quick --json /tmp/sync.json   # 2/4 ranks, 256 MiB
    .venv/bin/python bench/sync.py                                # 2/4/8 x 256 MiB/1 GiB
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.launch import check_outcomes, run_group, write_weights
from weave_slurm.sync.layout import WeightLayout
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec
from weave_slurm.sync.scenario import Method, Scenario

MIB = 1 << 20


def _times(results: list[dict[str, Any]]) -> list[float]:
    n = len(results[0]["steps"])
    return [float(max(r["steps"][i]["elapsed_s"] for r in results)) for i in range(n)]


def _sent(results: list[dict[str, Any]], step: int) -> int:
    return sum(r["steps"][step]["slow_link_bytes"] for r in results if r["pool"] == "train")


def _random_weights(d: Path, nbytes: int, fractions: list[float]) -> tuple[str, ...]:
    """bf16 weights; file ``i+1`` changes ``fractions[i]`` of file ``i``'s elements."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(nbytes // 2, generator=g).bfloat16()
    files = [write_weights(d / "v0", w.view(torch.uint8))]
    for i, frac in enumerate(fractions, 1):
        mask = torch.rand(w.numel(), generator=g) < frac  # cheaper than a randperm
        w = torch.where(mask, (w.float() * 1.01 + 1e-3).bfloat16(), w)
        files.append(write_weights(d / f"v{i}", w.view(torch.uint8)))
    return tuple(files)


def measure_link(link: EmulatedLink, d: Path, nbytes: int, reps: int, console: Console
                 ) -> dict[str, Any]:
    """Raw rate of one big gloo send (1 training rank -> 1 rollout rank) over the link."""
    files = _random_weights(d, nbytes, [])
    sc = Scenario("bench-raw", 1, 1, nbytes, files * reps, tuple(range(1, reps + 1)),
                  method=Method.NAIVE, verify=False, timeout_s=600.0)
    times = _times(check_outcomes(run_group(sc, link)))
    gbps = [nbytes * 8 / t / 1e9 for t in times]
    console.log(f"raw gloo send {nbytes // MIB} MiB: {statistics.median(gbps):.3f} Gbit/s")
    return {"size_mib": nbytes // MIB, "times_s": times, "gbps": gbps,
            "median_gbps": statistics.median(gbps)}


def bench_methods(link: EmulatedLink, d: Path, ranks: list[int], sizes_mib: list[int],
                  reps: int, baseline_max_gib: float, console: Console
                  ) -> list[dict[str, Any]]:
    rows = []
    for size in sizes_mib:
        nbytes = size * MIB
        files = _random_weights(d, nbytes, [])
        for n in ranks:
            for method in Method:
                if method is not Method.TWOTIER and n * size / 1024 > baseline_max_gib:
                    console.log(f"{n}-to-{n} {size} MiB {method.value}: skipped (too heavy)")
                    continue
                sc = Scenario("bench", n, n, nbytes, files * reps, tuple(range(1, reps + 1)),
                              method=method, verify=False, timeout_s=900.0)
                res = check_outcomes(run_group(sc, link))
                times = _times(res)
                rows.append({"ranks": n, "size_mib": size, "method": method.value,
                             "times_s": times, "time_s": statistics.median(times),
                             "slow_link_bytes": _sent(res, 0)})
                console.log(f"{n}-to-{n} {size} MiB {method.value}: "
                            f"{', '.join(f'{t:.2f}' for t in times)} s")
    return rows


def annotate(rows: list[dict[str, Any]], link_gbps: float) -> None:
    """Ideal time at the measured rate, fraction of it reached, speedups vs baselines."""
    by_key = {(r["ranks"], r["size_mib"], r["method"]): r for r in rows}
    for r in rows:
        r["ideal_s"] = r["slow_link_bytes"] * 8 / (link_gbps * 1e9)
        r["fraction_of_ideal"] = r["ideal_s"] / r["time_s"]
        r["link_gbps"] = r["slow_link_bytes"] * 8 / r["time_s"] / 1e9
        for base in (Method.NAIVE, Method.FLAT):
            other = by_key.get((r["ranks"], r["size_mib"], base.value))
            r[f"speedup_vs_{base.value}"] = other["time_s"] / r["time_s"] if other else None


def bench_delta(link: EmulatedLink, d: Path, size_mib: int, reps: int, console: Console
                ) -> list[dict[str, Any]]:
    fractions = [0.01, 0.10, 1.0]
    nbytes = size_mib * MIB
    files = _random_weights(d, nbytes, fractions)
    labels = ["first (full)", *(f"{f:.0%} changed" for f in fractions)]
    rows = _delta_runs(link, "bench-delta", files, nbytes, 2, labels, reps)
    gfiles, gbytes, word, frac = _grpo_weights(d)
    rows += _delta_runs(link, "bench-grpo", gfiles, gbytes, word,
                        ["grpo-toy weights (full)", f"grpo-toy GRPO step ({frac:.1%} changed)"],
                        reps)
    console.log("delta mode done")
    return rows


def _delta_runs(link: EmulatedLink, job: str, files: tuple[str, ...], nbytes: int, word: int,
                labels: list[str], reps: int) -> list[dict[str, Any]]:
    runs = []
    for _ in range(reps):
        sc = Scenario(job, 2, 2, nbytes, files, tuple(range(1, len(files) + 1)),
                      word_bytes=word, mode=SyncMode.DELTA, timeout_s=600.0)
        runs.append(check_outcomes(run_group(sc, link)))
    rows = []
    for i, label in enumerate(labels):
        ok = all(r["steps"][i]["identical"] for res in runs for r in res if r["pool"] == "rollout")
        rows.append({"update": label, "size_mib": nbytes / MIB,
                     "times_s": [_times(res)[i] for res in runs],
                     "time_s": statistics.median(_times(res)[i] for res in runs),
                     "slow_link_bytes": _sent(runs[0], i), "bit_identical": ok})
    return rows


def _grpo_weights(d: Path) -> tuple[tuple[str, ...], int, int, float]:
    """Weights of the reference job ``builtin:grpo-toy`` before and after one real GRPO
    step (after a first step, so the optimizer is in its steady state): files, size,
    delta word size and the fraction of changed elements."""
    from weave_slurm.workloads.api import JobContext, Role
    from weave_slurm.workloads.entry import start_job

    runner = start_job("builtin:grpo-toy", JobContext("bench-grpo", Role.TRAIN, seed=0))
    runner.train(runner.rollout(runner.weights_version))
    before = runner.export_weights()
    runner.train(runner.rollout(runner.weights_version))
    after = runner.export_weights()
    layout = WeightLayout.of(before)
    a, b = layout.flatten(before), layout.flatten(after)
    word = layout.word_bytes
    dt = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[word]
    frac = float((a.view(dt) != b.view(dt)).float().mean())
    files = (write_weights(d / "g0", a), write_weights(d / "g1", b))
    return files, layout.total_nbytes, word, frac


def _print(console: Console, link: dict[str, Any], methods: list[dict[str, Any]],
           delta: list[dict[str, Any]]) -> None:
    console.print(f"link: nominal {link['nominal_mbit']} Mbit/s, measured (one gloo send) "
                  f"{link['before']['median_gbps']:.3f} Gbit/s before, "
                  f"{link['after']['median_gbps']:.3f} after; ideal uses "
                  f"{link['used_gbps']:.3f}")
    t = Table(title="two-tier vs naive pull vs flat broadcast (median of reps)")
    for col in ("ranks", "MiB", "method", "time s", "slow-link MiB", "ideal s", "of ideal",
                "link Gbit/s", "vs naive", "vs flat"):
        t.add_column(col, justify="right")
    for r in methods:
        sp = [f"{r[k]:.2f}x" if r[k] else "-" for k in ("speedup_vs_naive", "speedup_vs_flat")]
        t.add_row(f"{r['ranks']}-to-{r['ranks']}", str(r["size_mib"]), r["method"],
                  f"{r['time_s']:.2f}", f"{r['slow_link_bytes'] / MIB:.0f}",
                  f"{r['ideal_s']:.2f}", f"{r['fraction_of_ideal']:.0%}",
                  f"{r['link_gbps']:.2f}", *sp)
    console.print(t)
    t = Table(title="delta mode, 2-to-2 (median of reps)")
    for col in ("update", "MiB", "slow-link MiB", "time s", "bit-identical"):
        t.add_column(col, justify="right")
    for r in delta:
        t.add_row(r["update"], f"{r['size_mib']:.1f}", f"{r['slow_link_bytes'] / MIB:.2f}",
                  f"{r['time_s']:.2f}", str(r["bit_identical"]))
    console.print(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2/4 ranks, 256 MiB only")
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--queue-ms", type=int, default=LinkSpec.latency_ms,
                    help="tbf latency: the slow link's queue in ms at its rate (400 ms at "
                    "1 Gbit/s is a 50 MB drop-tail buffer; a switch port has a few MB)")
    ap.add_argument("--ranks", type=int, nargs="*", help="override rank counts (n-to-n)")
    ap.add_argument("--sizes-mib", type=int, nargs="*", help="override weight sizes")
    ap.add_argument("--reps", type=int, default=3, help="syncs per configuration (median)")
    ap.add_argument("--baseline-max-gib", type=float, default=4.0,
                    help="skip naive/flat when ranks x size exceeds this (memory, time)")
    ap.add_argument("--delta-mib", type=int, default=256)
    ap.add_argument("--no-delta", action="store_true")
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()
    ranks = args.ranks or ([2, 4] if args.quick else [2, 4, 8])
    sizes = args.sizes_mib or ([256] if args.quick else [256, 1024])
    console = Console()
    d = Path(tempfile.mkdtemp(prefix="weave-sync-bench-", dir="/dev/shm"))
    try:
        with EmulatedLink(LinkSpec(rate_mbit=args.rate_mbit, burst_kbit=512,
                                   latency_ms=args.queue_ms)) as link:
            before = measure_link(link, d, 256 * MIB, args.reps, console)
            methods = bench_methods(link, d, ranks, sizes, args.reps, args.baseline_max_gib,
                                    console)
            delta = [] if args.no_delta else bench_delta(link, d, args.delta_mib, args.reps,
                                                         console)
            after = measure_link(link, d, 256 * MIB, args.reps, console)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    used = statistics.median(before["gbps"] + after["gbps"])
    link_info = {"nominal_mbit": args.rate_mbit, "queue_ms": args.queue_ms, "before": before,
                 "after": after, "used_gbps": used}
    annotate(methods, used)
    _print(console, link_info, methods, delta)
    if args.json:
        args.json.write_text(json.dumps({"link": link_info, "methods": methods,
                                         "delta": delta}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
