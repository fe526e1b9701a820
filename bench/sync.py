"""Benchmark: two-tier weight sync vs naive pull and flat broadcast, and delta mode.

Runs real rank processes (gloo) in two network namespaces joined by a veth pair shaped
to ``--rate-mbit`` in both directions (needs root, iproute2, tc). Prints rich tables
and writes JSON with ``--json OUT``.

    .venv/bin/python bench/sync.py --quick --json /tmp/sync.json
    .venv/bin/python bench/sync.py            # full matrix: 2/4/8 ranks x 256 MiB/1 GiB
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.launch import check_outcomes, run_group, write_weights
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec
from weave_slurm.sync.scenario import Method, Scenario

MIB = 1 << 20


def _time(results: list[dict[str, Any]], step: int) -> float:
    return float(max(r["steps"][step]["elapsed_s"] for r in results))


def _sent(results: list[dict[str, Any]], step: int) -> int:
    return sum(r["steps"][step]["slow_link_bytes"] for r in results if r["pool"] == "train")


def _random_weights(d: Path, nbytes: int, fractions: list[float]) -> tuple[str, ...]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(nbytes // 2, generator=g).bfloat16()
    files = [write_weights(d / "v0", w.view(torch.uint8))]
    for i, frac in enumerate(fractions, 1):
        w = w.clone()
        idx = torch.randperm(w.numel(), generator=g)[:int(frac * w.numel())]
        w[idx] = (w[idx].float() * 1.01 + 1e-3).bfloat16()
        files.append(write_weights(d / f"v{i}", w.view(torch.uint8)))
    return tuple(files)


def _grpo_weights(d: Path) -> tuple[tuple[str, ...], int, float]:
    """bf16 weights of a small Llama before and after real GRPO steps (fp32 master,
    AdamW lr 1e-6): returns the files, their size and the fraction of changed elements."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=384, intermediate_size=1024,
                      num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)

    def snapshot() -> torch.Tensor:
        return torch.cat([p.detach().bfloat16().reshape(-1) for p in model.parameters()])

    def grpo_step() -> None:
        prompts, group, resp = 4, 4, 32
        tokens = torch.randint(0, 4096, (prompts * group, 16 + resp))
        rewards = torch.rand(prompts * group)
        grouped = rewards.view(prompts, group)
        adv = ((grouped - grouped.mean(1, keepdim=True))
               / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
        logits = model(input_ids=tokens, use_cache=False).logits[:, 15:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, 16:, None])[..., 0]
        loss = -(adv[:, None] * logp).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()

    grpo_step()  # warm the optimizer state: step 2 vs step 1 is the steady state
    before = snapshot()
    grpo_step()
    after = snapshot()
    frac = float((before.view(torch.int16) != after.view(torch.int16)).float().mean())
    nbytes = before.numel() * 2
    files = (write_weights(d / "g0", before.view(torch.uint8)),
             write_weights(d / "g1", after.view(torch.uint8)))
    return files, nbytes, frac


def bench_methods(link: EmulatedLink, d: Path, ranks: list[int], sizes_mib: list[int],
                  rate_mbit: int, console: Console) -> list[dict[str, Any]]:
    rows = []
    for size in sizes_mib:
        nbytes = size * MIB
        files = _random_weights(d, nbytes, [])
        ideal_s = nbytes * 8 / (rate_mbit * 1e6)
        for n in ranks:
            times = {}
            for method in Method:
                sc = Scenario("bench", n, n, nbytes, files, (1,), method=method, verify=False,
                              timeout_s=600.0)
                res = check_outcomes(run_group(sc, link))
                times[method] = (_time(res, 0), _sent(res, 0))
                console.log(f"{n}-to-{n} {size} MiB {method.value}: {times[method][0]:.2f} s")
            for method, (t, sent) in times.items():
                rows.append({"ranks": n, "size_mib": size, "method": method.value,
                             "time_s": t, "slow_link_bytes": sent, "ideal_s": ideal_s,
                             "link_use": sent * 8 / (rate_mbit * 1e6) / t,
                             "efficiency_vs_ideal": ideal_s / t,
                             "speedup_vs_naive": times[Method.NAIVE][0] / t})
    return rows


def bench_delta(link: EmulatedLink, d: Path, size_mib: int, console: Console
                ) -> list[dict[str, Any]]:
    rows = []
    fractions = [0.01, 0.10, 1.0]
    nbytes = size_mib * MIB
    files = _random_weights(d, nbytes, fractions)
    sc = Scenario("bench-delta", 2, 2, nbytes, files, tuple(range(1, len(files) + 1)),
                  mode=SyncMode.DELTA, timeout_s=600.0)
    res = check_outcomes(run_group(sc, link))
    ok = all(s["identical"] for r in res if r["pool"] == "rollout" for s in r["steps"])
    for i, label in enumerate(["first (full)", *(f"{f:.0%} changed" for f in fractions)]):
        rows.append({"update": label, "size_mib": size_mib, "time_s": _time(res, i),
                     "slow_link_bytes": _sent(res, i), "bit_identical": ok})
    gfiles, gbytes, frac = _grpo_weights(d)
    sc = Scenario("bench-grpo", 2, 2, gbytes, gfiles, (1, 2), mode=SyncMode.DELTA)
    res = check_outcomes(run_group(sc, link))
    ok = all(s["identical"] for r in res if r["pool"] == "rollout" for s in r["steps"])
    for i, label in enumerate(["GRPO model (full)", f"GRPO step ({frac:.2%} changed)"]):
        rows.append({"update": label, "size_mib": gbytes / MIB, "time_s": _time(res, i),
                     "slow_link_bytes": _sent(res, i), "bit_identical": ok})
    console.log("delta mode done")
    return rows


def _print(console: Console, methods: list[dict[str, Any]], delta: list[dict[str, Any]]) -> None:
    t = Table(title="two-tier vs naive pull vs flat broadcast (slow link)")
    for col in ("ranks", "MiB", "method", "time s", "ideal s", "link use", "vs ideal",
                "speedup vs naive"):
        t.add_column(col, justify="right")
    for r in methods:
        t.add_row(f"{r['ranks']}-to-{r['ranks']}", str(r["size_mib"]), r["method"],
                  f"{r['time_s']:.2f}", f"{r['ideal_s']:.2f}", f"{r['link_use']:.0%}",
                  f"{r['efficiency_vs_ideal']:.0%}", f"{r['speedup_vs_naive']:.2f}x")
    console.print(t)
    t = Table(title="delta mode, 2-to-2")
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
    ap.add_argument("--ranks", type=int, nargs="*", help="override rank counts (n-to-n)")
    ap.add_argument("--sizes-mib", type=int, nargs="*", help="override weight sizes")
    ap.add_argument("--delta-mib", type=int, default=256)
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()
    ranks = args.ranks or ([2, 4] if args.quick else [2, 4, 8])
    sizes = args.sizes_mib or ([256] if args.quick else [256, 1024])
    console = Console()
    d = Path(tempfile.mkdtemp(prefix="weave-sync-bench-", dir="/dev/shm"))
    try:
        with EmulatedLink(LinkSpec(rate_mbit=args.rate_mbit, burst_kbit=512)) as link:
            methods = bench_methods(link, d, ranks, sizes, args.rate_mbit, console)
            delta = bench_delta(link, d, args.delta_mib, console)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    _print(console, methods, delta)
    if args.json:
        args.json.write_text(json.dumps({"rate_mbit": args.rate_mbit, "methods": methods,
                                         "delta": delta}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
