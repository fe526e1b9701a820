"""Long-tail migration: group throughput with it off vs on, same jobs, same seeds.

A group of long-tailed reference GRPO jobs (``builtin:grpo-toy`` with
``response_len_max``: responses end at EOS or a heavy-tailed per-request cap) shares
one h20 node daemon; each job trains on its own h800 node daemon by default
(``--train-nodes``), so the shared rollout node is the group's bottleneck, as in RL
post-training where rollout dominates. Runs alternate off/on (``--repeats`` pairs, the
order flipped every pair), each with fresh member ids on the same node daemons.

Measured over each run's *steady window* (from the moment every member finished its
first rollout, so the model builds of fresh resident workers are left out, to the
end): steps/s of the group (training steps ending in the window / window), the
rollout node's busy fraction, tails migrated. Identity: per member, SHA-256 of its
final weights and of its reward curve; every run must give the same digests.

    .venv/bin/python bench/longtail.py --jobs 3 --steps 10 --repeats 4 \
        --json bench/results/longtail.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.node.node_client import NodeClient
from weave_slurm.runtime.group import GroupLayout, MemberSpec
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.runner import GroupRunner, RunnerConfig
from weave_slurm.runtime.timeline import Span, busy_fraction
from weave_slurm.slurm.cluster_config import parse_layout
from weave_slurm.slurm.local_backend import LocalBackend
from weave_slurm.vocab import Phase, Pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.harness
from tests.harness.fleet import FleetConfig, NodeFleet

#: The long-tailed job of the benchmark (default model; 64 responses of up to 96 actions).
OPTIONS: dict[str, Any] = {"prompts_per_step": 8, "group_size": 8, "minibatches": 1,
                           "response_len_max": 96, "length_tail_alpha": 1.0}


def _digest(ex: GroupRunner, job_id: str) -> tuple[str, str]:
    member = ex.members[job_id]
    with NodeClient(member.train_node.socket_path) as client:
        seg = client.attach(member.job)["weights"]
        h = hashlib.sha256()
        for name in sorted(seg.tensors):
            t = seg.tensors[name].contiguous()
            h.update(name.encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    rewards = hashlib.sha256(b"".join(struct.pack("<d", r) for r in member.rewards))
    return h.hexdigest()[:16], rewards.hexdigest()[:16]


def _window(spans: list[Span], jobs: list[str]) -> tuple[float, float]:
    """From every member's first rollout end to the last phase end."""
    firsts = [min(s.end_s for s in spans if s.job_id == j and s.kind is Phase.ROLLOUT
                  and s.ok) for j in jobs]
    return max(firsts), max(s.end_s for s in spans)


def _clip(spans: list[Span], t0: float, t1: float) -> list[Span]:
    return [dataclasses.replace(s, start_s=max(s.start_s, t0), end_s=min(s.end_s, t1))
            for s in spans if s.end_s > t0 and s.start_s < t1]


def _overlap_s(spans: list[Span], nodes: list[str]) -> float:
    """Seconds two rollouts ran at once on a node (a tail beside the next bulk)."""
    total = 0.0
    for node in nodes:
        rolls = [s for s in spans if s.node == node and s.kind is Phase.ROLLOUT]
        summed = sum(s.end_s - s.start_s for s in rolls)
        wall = busy_fraction(rolls, Pool.ROLLOUT, [node], 0.0, 1.0)   # union, in seconds
        total += summed - wall
    return total


def run_once(layout: GroupLayout, tag: str, args: argparse.Namespace,
             options: dict[str, Any], migrate: bool) -> dict[str, Any]:
    specs = [MemberSpec(f"{tag}-m{i}", seed=100 + i, steps=args.steps, options=options,
                        train_nodes=(i % len(layout.train),)) for i in range(args.jobs)]
    config = RunnerConfig(long_tail_migration=migrate, tail_fraction=args.tail_fraction)
    ex = GroupRunner(layout, specs, config=config)
    wall0 = time.monotonic()
    try:
        ex.run(timeout_s=args.timeout_s)
        wall = time.monotonic() - wall0
        jobs = [s.job_id for s in specs]
        t0, t1 = _window(ex.spans, jobs)
        steps = sum(1 for s in ex.spans if s.kind is Phase.TRAIN and s.ok and s.end_s > t0)
        names = [n.name for n in layout.rollout]
        window = _clip(ex.spans, t0, t1)
        tail_s = [m.at_s for m in ex.tail_moves if m.at_s >= t0]
        digests = {f"m{i}": _digest(ex, s.job_id) for i, s in enumerate(specs)}
        return {"migrate": migrate, "tag": tag, "wall_s": wall, "window_s": t1 - t0,
                "window_steps": steps, "steps_per_s": steps / (t1 - t0),
                "rollout_busy": busy_fraction(window, Pool.ROLLOUT, names, t0, t1),
                "train_busy": busy_fraction(window, Pool.TRAIN,
                                            [n.name for n in layout.train], t0, t1),
                "tails": len(ex.tail_moves), "tails_in_window": len(tail_s),
                "overlap_s": _overlap_s(window, names), "load_1m": os.getloadavg()[0],
                "weights": {k: v[0] for k, v in digests.items()},
                "rewards": {k: v[1] for k, v in digests.items()},
                "reward_curves": {f"m{i}": list(ex.members[s.job_id].rewards)
                                  for i, s in enumerate(specs)}}
    finally:
        port = GroupPort(ex)
        port.apply(*(Leave(job) for job in port.order))
        ex.close()


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=4, help="off/on pairs, interleaved")
    parser.add_argument("--train-nodes", type=int, default=None,
                        help="h800 node daemons (default: one per job)")
    parser.add_argument("--tail-fraction", type=float, default=0.25)
    parser.add_argument("--options", type=str, default=None,
                        help="JSON merged into the job options")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=None, dest="json_out")
    args = parser.parse_args()
    for flag in ("jobs", "steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
    if not 0.0 < args.tail_fraction < 1.0:
        parser.error(f"--tail-fraction: must be in (0, 1), got {args.tail_fraction}")
    try:
        extra = json.loads(args.options) if args.options else {}
    except json.JSONDecodeError as exc:
        parser.error(f"--options: not a JSON object ({exc}); e.g. '{{\"group_size\": 4}}'")
    if not isinstance(extra, dict):
        parser.error(f"--options: not a JSON object, got {args.options!r}")
    options = {**OPTIONS, **extra}
    train_nodes = args.train_nodes or args.jobs
    work = Path(tempfile.mkdtemp(prefix="weave-bench-lt-"))
    shm = Path(tempfile.mkdtemp(prefix="weave-bench-lt-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    cluster = parse_layout(f"h20=1,h800={train_nodes}")
    fleet = NodeFleet(LocalBackend(work / "backend", cluster),
                      FleetConfig("lt", shm, work, train_nodes=train_nodes))
    runs: list[dict[str, Any]] = []
    console = Console(width=150)
    try:
        layout = fleet.start()
        for r in range(args.repeats):
            for migrate in ((False, True) if r % 2 == 0 else (True, False)):
                tag = f"r{r}{'on' if migrate else 'off'}"
                run = run_once(layout, tag, args, options, migrate)
                console.print(f"{tag}: {run['steps_per_s']:.3f} steps/s, rollout busy "
                              f"{run['rollout_busy']:.1%}, tails {run['tails']}, "
                              f"wall {run['wall_s']:.1f} s, load {os.getloadavg()[0]:.1f}")
                runs.append(run)
    finally:
        fleet.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    off = [x for x in runs if not x["migrate"]]
    on = [x for x in runs if x["migrate"]]
    ratios = [b["steps_per_s"] / a["steps_per_s"] for a, b in
              zip(sorted(off, key=lambda x: x["tag"]), sorted(on, key=lambda x: x["tag"]),
                  strict=True)]
    same_weights = len({json.dumps(x["weights"], sort_keys=True) for x in runs}) == 1
    same_rewards = len({json.dumps(x["rewards"], sort_keys=True) for x in runs}) == 1
    table = Table(title=f"long-tail migration: {args.jobs} jobs x {args.steps} steps, "
                  f"1 h20 + {train_nodes} h800, tail <= {args.tail_fraction:.0%} of requests, "
                  f"{args.repeats} pairs (median [min..max])")
    for col in ("MIGRATION", "STEPS/S", "H20 BUSY", "H800 BUSY", "TAILS", "OVERLAP_S",
                "WINDOW_S"):
        table.add_column(col)
    for name, xs in (("off", off), ("on", on)):
        table.add_row(name, _spread([x["steps_per_s"] for x in xs]),
                      _spread([x["rollout_busy"] for x in xs]),
                      _spread([x["train_busy"] for x in xs]),
                      str(statistics.median([x["tails"] for x in xs])),
                      _spread([x["overlap_s"] for x in xs]),
                      _spread([x["window_s"] for x in xs]))
    table.add_row("on/off", _spread(ratios), "", "", "", "", "")
    console.print(table)
    console.print(f"final weights identical in all runs: {same_weights}; reward curves "
                  f"identical: {same_rewards}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({
            "jobs": args.jobs, "steps": args.steps, "repeats": args.repeats,
            "train_nodes": train_nodes, "tail_fraction": args.tail_fraction,
            "options": options, "ratio_median": statistics.median(ratios),
            "ratios": ratios, "same_weights": same_weights, "same_rewards": same_rewards,
            "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
