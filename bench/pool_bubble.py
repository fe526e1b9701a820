"""Where pooled weave's rollout bubble is (docs/simulator.md, "Pooled rollout").

    .venv/bin/python bench/pool_bubble.py [--traces wild,11] [--json OUT]

Replays weave with pooled rollout in the consistent accounting (a trace name, or a seed
of a generated 200-job trace) and charges each segment of constant membership its
schedule's expected idle rollout time. Segments are told apart by their size and by what
binds their expected period: the members' rollouts ("rollout"), their training in turn
("training"), or one member's own rollout then training ("own cycle": the pool idles
while that member trains). For each kind: its share of the pool's node-time, its bubble
and its share of the idle time.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Group
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions
from weave_slurm.sim.traces import Trace

_TIE = 1 - 1e-3   # a bound within 0.1% of the period binds it


def binds(group: Group) -> str:
    """What binds ``group``'s expected period (module doc)."""
    factors = group.rollout_factors or (1.0,) * group.size
    rollout = [m.turns * m.job.rollout_mean_s * f
               for m, f in zip(group.members, factors, strict=True)]
    train = [m.turns * m.job.train_mean_s for m in group.members]
    own = max(r + t for r, t in zip(rollout, train, strict=True))
    if sum(rollout) >= max(sum(train), own) * _TIE:
        return "rollout"
    return "training" if sum(train) >= own * _TIE else "own cycle"


def breakdown(trace: Trace, cap: Capacity) -> dict[str, Any]:
    """The pooled weave replay's rollout bubble by kind of segment (module doc)."""
    result = Replay(trace, cap, SimPolicy.make("weave"),
                    ReplayOptions(accounting=Accounting.CONSISTENT)).run()
    held: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = defaultdict(float)
    for seg in result.segments:
        g, dt = seg.group, seg.end_s - seg.start_s
        if dt <= 0 or g.colocated:
            continue
        kind = f"{'pooled' if g.pooled else 'pinned'}, {min(g.size, 4)}{'+' * (g.size > 3)}" \
            f" {'member' if g.size == 1 else 'members'}, {binds(g)} binds"
        held[kind] += g.rollout_held_nodes * dt
        idle[kind] += g.rollout_held_nodes * dt * max(0.0, 1 - g.schedule.rollout_busy)
    total, total_idle = sum(held.values()), sum(idle.values())
    report = result.node_s["rollout"]
    return {"bubble_expected": total_idle / total if total else 0.0,
            "bubble_replay": 1 - result.busy_node_s["rollout"] / report if report else 0.0,
            "kinds": {k: {"held_share": held[k] / total, "bubble": idle[k] / held[k],
                          "idle_share": idle[k] / total_idle if total_idle else 0.0}
                      for k in sorted(held, key=lambda k: -idle[k])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="wild,11",
                    help="trace names or seeds of generated 200-job traces, comma-separated")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cap = replace(Capacity.from_site(reference_site(), 5), rollout_pooled=True)
    out: dict[str, Any] = {}
    console = Console(width=120)
    for name in args.traces.split(","):
        trace = generate_trace(GeneratorConfig(n_jobs=200, seed=int(name))) \
            if name.isdigit() else load_trace(name)
        out[name] = found = breakdown(trace, cap)
        table = Table(title=f"{name}: rollout bubble {100 * found['bubble_replay']:.1f}% "
                            f"(segments' expected {100 * found['bubble_expected']:.1f}%)")
        for col in ("segments", "share of node-time", "bubble", "share of idle time"):
            table.add_column(col, justify="left" if col == "segments" else "right")
        for kind, row in found["kinds"].items():
            table.add_row(kind, f"{100 * row['held_share']:.1f}%",
                          f"{100 * row['bubble']:.1f}%", f"{100 * row['idle_share']:.1f}%")
        console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
