"""Benchmark: two-tier weight sync vs naive pull and flat broadcast, and delta mode.

Runs real rank processes (gloo) in two network namespaces joined by a veth pair shaped
to ``--rate-mbit`` in both directions (needs root, iproute2, tc). With ``--hosts`` the
ranks run on the hosts of a separate-hosts Slurm cluster instead (2 h800 + 2 h20 hosts,
brought up and down here, or the one in ``--cluster-state``): training ranks on the
h800 hosts, rollout ranks on the h20 hosts, each a process in its host's namespaces,
across the cluster's inter-pool link shaped to ``--rate-mbit`` (tbf, 20 ms queue);
the link's own byte counter is reported next to the sync's.

The ideal time of a sync is its slow-link bytes over the MEASURED link rate: one big
gloo send (1-to-1) across the slow link, measured before the matrix and again after
it. Every configuration runs ``--reps`` syncs in one process group; the median is
reported. Prints rich tables and writes JSON with ``--json OUT``.

    .venv/bin/python bench/sync.py --quick --json /tmp/sync.json   # 2/4 ranks, 256 MiB
    .venv/bin/python bench/sync.py                                # 2/4/8 x 256 MiB/1 GiB
    .venv/bin/python bench/sync.py --hosts --no-delta --json /tmp/hosts.json  # 2+2, 4+4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.errors import WeaveError
from weave_slurm.slurm.cluster_config import HostMode
from weave_slurm.slurm.host_plan import QUEUE_LATENCY_MS, tbf_argv
from weave_slurm.slurm.local_cluster import LocalCluster
from weave_slurm.sync.flat_layout import WeightLayout
from weave_slurm.sync.group_launch import ClusterHosts, check_outcomes, run_group, write_weights
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec
from weave_slurm.sync.scenario import Method, Scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.harness
from tests.harness.hosts import LAYOUT, free_subnet

MIB = 1 << 20
SyncSite = EmulatedLink | ClusterHosts


def _run(site: SyncSite, sc: Scenario) -> tuple[list[dict[str, Any]], float | None]:
    """One group run: per-rank results, and on hosts the bytes the inter-pool link
    carried towards the rollout pool per sync (headers and gloo's setup included)."""
    hosts = site if isinstance(site, ClusterHosts) else None
    before = hosts.wire_bytes() if hosts else 0
    res = check_outcomes(run_group(sc, site))
    return res, (hosts.wire_bytes() - before) / len(sc.versions) if hosts else None


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


def measure_link(link: SyncSite, d: Path, nbytes: int, reps: int, console: Console
                 ) -> dict[str, Any]:
    """Raw rate of one big gloo send (1 training rank -> 1 rollout rank) over the link."""
    files = _random_weights(d, nbytes, [])
    sc = Scenario("bench-raw", 1, 1, nbytes, files * reps, tuple(range(1, reps + 1)),
                  method=Method.NAIVE, verify=False, timeout_s=600.0)
    res, wire = _run(link, sc)
    times = _times(res)
    gbps = [nbytes * 8 / t / 1e9 for t in times]
    console.log(f"raw gloo send {nbytes // MIB} MiB: {statistics.median(gbps):.3f} Gbit/s")
    return {"size_mib": nbytes // MIB, "times_s": times, "gbps": gbps,
            "median_gbps": statistics.median(gbps), "wire_bytes": wire}


def bench_methods(link: SyncSite, d: Path, ranks: list[int], sizes_mib: list[int],
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
                res, wire = _run(link, sc)
                times = _times(res)
                rows.append({"ranks": n, "size_mib": size, "method": method.value,
                             "times_s": times, "time_s": statistics.median(times),
                             "slow_link_bytes": _sent(res, 0), "wire_bytes": wire,
                             "hosts": sorted({f"{r['pool']}:{r['host']}" for r in res})})
                console.log(f"{n}-to-{n} {size} MiB {method.value}: "
                            f"{', '.join(f'{t:.2f}' for t in times)} s")
    return rows


def annotate(rows: list[dict[str, Any]], link_gbps: float, nominal_mbit: int) -> None:
    """Ideal time at the measured rate (and at the nominal one), fraction of it reached,
    speedups vs baselines."""
    by_key = {(r["ranks"], r["size_mib"], r["method"]): r for r in rows}
    for r in rows:
        r["ideal_s"] = r["slow_link_bytes"] * 8 / (link_gbps * 1e9)
        r["ideal_nominal_s"] = r["slow_link_bytes"] * 8 / (nominal_mbit * 1e6)
        r["fraction_of_ideal"] = r["ideal_s"] / r["time_s"]
        r["link_gbps"] = r["slow_link_bytes"] * 8 / r["time_s"] / 1e9
        for base in (Method.NAIVE, Method.FLAT):
            other = by_key.get((r["ranks"], r["size_mib"], base.value))
            r[f"speedup_vs_{base.value}"] = other["time_s"] / r["time_s"] if other else None


def bench_delta(link: SyncSite, d: Path, size_mib: int, reps: int, console: Console
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


def _delta_runs(link: SyncSite, job: str, files: tuple[str, ...], nbytes: int, word: int,
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
    where = (f"across hosts ({', '.join(link['hosts'])}), " if link.get("hosts") else "")
    console.print(f"link: {where}nominal {link['nominal_mbit']} Mbit/s, queue "
                  f"{link['queue_ms']} ms, burst {link['burst_kbit']} kbit, measured (one "
                  f"gloo send) {link['before']['median_gbps']:.3f} Gbit/s before, "
                  f"{link['after']['median_gbps']:.3f} after; ideal uses "
                  f"{link['used_gbps']:.3f}")
    wire = any(r.get("wire_bytes") is not None for r in methods)
    t = Table(title="two-tier vs naive pull vs flat broadcast (median of reps)")
    for col in ("ranks", "MiB", "method", "time s", "runs s", "slow-link MiB",
                *(["wire MiB"] if wire else []), "ideal s", "of ideal", "link Gbit/s",
                "vs naive", "vs flat"):
        t.add_column(col, justify="right")
    for r in methods:
        sp = [f"{r[k]:.2f}x" if r[k] else "-" for k in ("speedup_vs_naive", "speedup_vs_flat")]
        w = [f"{r['wire_bytes'] / MIB:.0f}"] if wire else []
        t.add_row(f"{r['ranks']}-to-{r['ranks']}", str(r["size_mib"]), r["method"],
                  f"{r['time_s']:.2f}", ", ".join(f"{x:.2f}" for x in r["times_s"]),
                  f"{r['slow_link_bytes'] / MIB:.0f}", *w,
                  f"{r['ideal_s']:.2f}", f"{r['fraction_of_ideal']:.0%}",
                  f"{r['link_gbps']:.2f}", *sp)
    console.print(t)
    if not delta:
        return
    t = Table(title="delta mode, 2-to-2 (median of reps)")
    for col in ("update", "MiB", "slow-link MiB", "time s", "bit-identical"):
        t.add_column(col, justify="right")
    for r in delta:
        t.add_row(r["update"], f"{r['size_mib']:.1f}", f"{r['slow_link_bytes'] / MIB:.2f}",
                  f"{r['time_s']:.2f}", str(r["bit_identical"]))
    console.print(t)


@contextlib.contextmanager
def _netns_site(args: argparse.Namespace) -> Iterator[tuple[SyncSite, Path, dict[str, Any]]]:
    """Two namespaces joined by a shaped veth; scratch in /dev/shm."""
    queue_ms = LinkSpec.latency_ms if args.queue_ms is None else args.queue_ms
    burst = args.burst_kbit or LinkSpec.burst_kbit
    d = Path(tempfile.mkdtemp(prefix="weave-sync-bench-", dir="/dev/shm"))
    try:
        with EmulatedLink(LinkSpec(rate_mbit=args.rate_mbit, burst_kbit=burst,
                                   latency_ms=queue_ms)) as link:
            yield link, d, {"mode": "netns", "queue_ms": queue_ms, "burst_kbit": burst}
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _hosts_site(args: argparse.Namespace, console: Console
                ) -> Iterator[tuple[SyncSite, Path, dict[str, Any]]]:
    """The hosts of a separate-hosts cluster (brought up here and down at the end, or
    the one in ``--cluster-state``, whose shaping is put back); scratch on its shared
    work dir, which every host sees."""
    if args.queue_ms not in (None, QUEUE_LATENCY_MS) or args.burst_kbit is not None:
        raise SystemExit("--queue-ms/--burst-kbit: with --hosts the cluster's shaping sets "
                         f"them (a {QUEUE_LATENCY_MS} ms queue, a burst of 1 ms at the rate, "
                         "at least 512 kbit: 'weave cluster shape')")
    gbps = args.rate_mbit / 1000
    own = args.cluster_state is None
    state = Path(tempfile.mkdtemp(prefix="weave-sync-hosts-")) if own else args.cluster_state
    cluster = LocalCluster(state)
    previous = None if own else _shaped_gbps(cluster)
    d: Path | None = None
    try:
        if own:
            cluster.up(LAYOUT, hosts=HostMode.SEPARATE, subnet=free_subnet(),
                       interpool_gbps=gbps, timeout_s=60)
        else:
            cluster.shape_interpool(gbps)
        hosts = ClusterHosts(cluster)
        d = Path(tempfile.mkdtemp(prefix="weave-sync-bench-", dir=hosts.scratch_root))
        console.log(f"cluster {state}: {hosts.plan.subnet}, link shaped to {gbps:g} Gbit/s")
        tbf = tbf_argv("dev", gbps)  # what shape_interpool put on the link
        yield hosts, d, {"mode": "hosts", "queue_ms": QUEUE_LATENCY_MS,
                         "burst_kbit": int(tbf[tbf.index("burst") + 1].removesuffix("kbit")),
                         "subnet": hosts.plan.subnet,
                         "hosts": [f"{n.name} {n.addr}" for n in hosts.plan.nodes]}
    finally:
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
        if own:
            cluster.down()
            shutil.rmtree(state, ignore_errors=True)
        else:
            cluster.shape_interpool(previous)


def _shaped_gbps(cluster: LocalCluster) -> float | None:
    """The inter-pool shaping the cluster was brought up or last shaped with."""
    try:
        value = json.loads(cluster.paths.manifest.read_text()).get("interpool_gbps")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, int | float) else None


def _terminated(signum: int, frame: object) -> NoReturn:
    sys.exit(128 + signum)  # unwinds, so the link or the cluster is removed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2/4 ranks, 256 MiB only")
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--queue-ms", type=int, default=None,
                    help="tbf latency: the slow link's queue in ms at its rate (default "
                    f"{LinkSpec.latency_ms}; 400 ms at 1 Gbit/s is a 50 MB drop-tail buffer, "
                    f"a switch port has a few MB; with --hosts always {QUEUE_LATENCY_MS})")
    ap.add_argument("--burst-kbit", type=int, default=None,
                    help=f"tbf burst (default {LinkSpec.burst_kbit}; 512 kbit is 0.5 ms at "
                    "1 Gbit/s, too little on a loaded machine: docs/sync.md)")
    ap.add_argument("--hosts", action="store_true",
                    help="run the ranks on the hosts of a separate-hosts Slurm cluster "
                    "(default ranks 2 4, sizes 256)")
    ap.add_argument("--cluster-state", type=Path,
                    help="with --hosts: use the cluster in this state dir (left up)")
    ap.add_argument("--ranks", type=int, nargs="*", help="override rank counts (n-to-n)")
    ap.add_argument("--sizes-mib", type=int, nargs="*", help="override weight sizes")
    ap.add_argument("--reps", type=int, default=3, help="syncs per configuration (median)")
    ap.add_argument("--baseline-max-gib", type=float, default=4.0,
                    help="skip naive/flat when ranks x size exceeds this (memory, time)")
    ap.add_argument("--delta-mib", type=int, default=256)
    ap.add_argument("--no-delta", action="store_true")
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()
    if args.cluster_state is not None and not args.hosts:
        ap.error("--cluster-state: only with --hosts")
    short = args.quick or args.hosts
    ranks = args.ranks or ([2, 4] if short else [2, 4, 8])
    sizes = args.sizes_mib or ([256] if short else [256, 1024])
    console = Console() if sys.stdout.isatty() else Console(width=200)
    signal.signal(signal.SIGTERM, _terminated)
    site = _hosts_site(args, console) if args.hosts else _netns_site(args)
    with site as (link, d, where):
        before = measure_link(link, d, 256 * MIB, args.reps, console)
        methods = bench_methods(link, d, ranks, sizes, args.reps, args.baseline_max_gib,
                                console)
        delta = [] if args.no_delta else bench_delta(link, d, args.delta_mib, args.reps,
                                                     console)
        after = measure_link(link, d, 256 * MIB, args.reps, console)
    used = statistics.median(before["gbps"] + after["gbps"])
    link_info = {"nominal_mbit": args.rate_mbit, **where, "before": before, "after": after,
                 "used_gbps": used}
    annotate(methods, used, args.rate_mbit)
    _print(console, link_info, methods, delta)
    if args.json:
        args.json.write_text(json.dumps({"link": link_info, "methods": methods,
                                         "delta": delta}, indent=1))
    return 0


def _main() -> int:
    try:
        return main()
    except WeaveError as exc:  # one line, as the CLIs do; the cluster is down already
        print(f"bench/sync.py: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(_main())
