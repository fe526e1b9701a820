"""Where weave's rollout bubble comes from, and two designs for closing it measured
before building them (docs/simulator.md, "How much bubble is structural").

    .venv/bin/python bench/rollout_bubble.py [--json OUT]

1. **Where** (weave's replay, consistent accounting): the rollout node-time idle per
   kind of group (members, rollout nodes), and two optimistic bounds for sharing rollout
   nodes between groups, computed from the replay's segments: each group's rollout need
   (its busy rollout node-time per period, in nodes) rounded up per pair of groups, and
   for all groups at once ("fluid": ignoring how the groups' schedules would interlock).
2. **Sub-node rollout slices**: the rollout pool counted in slices of half a node (a
   job's 8 rollout GPUs are 2 slices, priced and sized per slice), and a job may take a
   *narrow* shape (half its slices, its rollout twice as long: linear in GPUs, which
   long-tailed generation does not beat) wherever that lowers its group's cost per unit
   of work; its SLO budget stays that of its full shape. Placement and the replay are
   the real ones; the slicing is applied to their inputs here (a context manager swaps
   the replay's profile function and wraps ``WeavePolicy.place``), because it is an
   experiment, not a feature.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import weave_slurm.sim.bound as bound_mod
import weave_slurm.sim.replay as replay_mod
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement import engine
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Decision, Placement
from weave_slurm.placement.group import Group
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.outcome import ReplayResult
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions
from weave_slurm.sim.report import build_report
from weave_slurm.sim.traces import Trace

GPUS = {"rollout": 8, "train": 8}
SLICES = 2   # slices per rollout node


def _replays(trace: Trace, policies: tuple[str, ...], cap: Capacity,
             base: Capacity) -> dict[str, ReplayResult]:
    opts = ReplayOptions(accounting=Accounting.CONSISTENT)
    out = {n: Replay(trace, base, SimPolicy.make(n), opts).run()
           for n in ("isolated", "colocated")}
    out.update({n: Replay(trace, cap, SimPolicy.make(n), opts).run() for n in policies})
    return out


def _rows(res: dict[str, ReplayResult], policies: tuple[str, ...]) -> dict[str, Any]:
    rep = build_report(res, GPUS)["policies"]
    return {n: {"vs_isolated": rep[n]["ratios"]["vs_isolated"],
                "vs_colocated": rep[n]["ratios"]["vs_colocated"],
                "cost_over_bound": rep[n]["cost_over_bound"]["total"],
                "bubble": rep[n]["bubble"], "slo_violations": rep[n]["slo_violations"],
                "life_slo_violations": rep[n]["life_slo_violations"]} for n in policies}


# -- 1. where the rollout bubble is ---------------------------------------------------

def _need(g: Group) -> float:
    """Rollout nodes' worth of busy time per period (expected durations)."""
    pe = g.schedule.expected_period_s
    return sum(m.turns * m.job.rollout_mean_s * len(m.rollout_pins) for m in g.members) / pe


def where(res: ReplayResult) -> dict[str, Any]:
    held = busy = 0.0
    by_kind: Counter[tuple[int, int]] = Counter()
    idle_by: Counter[tuple[int, int]] = Counter()
    edges: dict[float, list[tuple[int, float]]] = {}
    for k, seg in enumerate(res.segments):
        g, dt = seg.group, seg.end_s - seg.start_s
        if dt <= 0 or g.colocated or not g.rollout_nodes:
            continue
        need = _need(g)
        held += g.rollout_nodes * dt
        busy += need * dt
        kind = (g.size, g.rollout_nodes)
        by_kind[kind] += g.rollout_nodes * dt
        idle_by[kind] += (g.rollout_nodes - need) * dt
        edges.setdefault(seg.start_s, []).append((k, need))
        edges.setdefault(seg.end_s, []).append((-k - 1, need))
    live: dict[int, float] = {}
    pooled = paired = 0.0
    last = None
    for t in sorted(edges):
        if last is not None and live:
            needs = list(live.values())
            pooled += math.ceil(sum(needs) - 1e-9) * (t - last)
            paired += _paired_nodes(needs) * (t - last)
        for k, need in edges[t]:
            if k >= 0:
                live[k] = need
            else:
                live.pop(-k - 1, None)
        last = t
    kinds = sorted(by_kind, key=lambda kd: -idle_by[kd])[:8]
    return {"bubble": 1 - busy / held,
            "by_group": [{"members": m, "rollout_nodes": r,
                          "share_of_rollout_time": by_kind[(m, r)] / held,
                          "idle_points": 100 * idle_by[(m, r)] / held,
                          "idle_inside": idle_by[(m, r)] / by_kind[(m, r)]}
                         for m, r in kinds],
            "pairs_bound": {"bubble": 1 - busy / paired, "rollout_node_time": paired / held},
            "fluid_bound": {"bubble": 1 - busy / pooled, "rollout_node_time": pooled / held}}


def _paired_nodes(needs: list[float]) -> int:
    """Rollout nodes if groups shared them in pairs: fractional parts matched largest
    with smallest, each pair rounded up."""
    frac = sorted(needs, key=lambda n: n - math.floor(n))
    total = 0
    while frac:
        a = frac.pop()
        total += math.ceil(a + frac.pop(0) - 1e-9) if frac else math.ceil(a - 1e-9)
    return total


# -- 2. sub-node rollout slices --------------------------------------------------------

def _narrow(p: JobProfile) -> JobProfile:
    """Half the slices, the rollout twice as long, the full shape's SLO budget."""
    q = replace(p, rollout_nodes=p.rollout_nodes // 2, rollout_max_s=2 * p.rollout_max_s,
                rollout_mean_s=2 * p.rollout_mean_s)
    return replace(q, slo=p.slo * p.solo_s / q.solo_s)


@contextlib.contextmanager
def sliced(narrow: bool) -> Iterator[None]:
    """The replay's trace jobs in rollout slices (grouped policies only), and with
    ``narrow`` every WeavePolicy decision also tries each job's narrow shape."""
    job_profile, place = replay_mod.job_profile, engine.WeavePolicy.place
    full: dict[str, JobProfile] = {}

    def sliced_profile(job: Any, policy: str, *args: Any) -> JobProfile:
        p = job_profile(job, policy, *args)
        if policy in ("isolated", "colocated"):
            return p
        return replace(p, rollout_nodes=p.rollout_nodes * SLICES,
                       rollout_state_gib=p.rollout_state_gib / SLICES)

    def work(state: ClusterState, d: Placement) -> float:
        def rate(g: Group | None) -> float:
            if g is None:
                return 0.0
            pe = g.schedule.expected_period_s
            return sum(m.turns * full.get(m.job.job_id, m.job).solo_mean_s / pe
                       for m in g.members)
        gained = rate(d.group) - rate(state.by_id.get(d.group.group_id))
        return d.cost_delta_per_hour / gained if gained > 1e-9 else math.inf

    def either(self: engine.WeavePolicy, state: ClusterState, job: JobProfile) -> Decision:
        base = full.setdefault(job.job_id, job)
        d = place(self, state, base)
        if base.rollout_nodes < 2 or base.rollout_nodes % 2:
            return d
        q = _narrow(base)
        if q.slo < 1.0:
            return d
        d2 = place(self, state, q)
        if isinstance(d2, Placement) and (not isinstance(d, Placement)
                                          or work(state, d2) < work(state, d) - 1e-9):
            return d2
        return d

    replay_mod.job_profile = bound_mod.job_profile = sliced_profile  # type: ignore[assignment]
    if narrow:
        engine.WeavePolicy.place = either  # type: ignore[method-assign]
    try:
        yield
    finally:
        replay_mod.job_profile = bound_mod.job_profile = job_profile
        engine.WeavePolicy.place = place  # type: ignore[method-assign]


def slices(trace: Trace, base: Capacity) -> dict[str, Any]:
    cap = replace(base, rollout_mem_gib=base.rollout_mem_gib / SLICES,
                  rates=CostRates(base.rates.rollout_node_hour / SLICES,
                                  base.rates.train_node_hour),
                  rollout_pool_nodes=base.rollout_pool_nodes * SLICES,
                  max_rollout_nodes_per_group=base.max_rollout_nodes_per_group * SLICES)
    pols = ("weave", "weave-online")
    out = {"whole nodes": _rows(_replays(trace, pols, base, base), pols)}
    with sliced(narrow=False):
        out["half-node slices"] = _rows(_replays(trace, pols, cap, base), pols)
    with sliced(narrow=True):
        out["half-node slices + narrow shapes"] = _rows(_replays(trace, pols, cap, base),
                                                        pols)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = Capacity.from_site(reference_site(), 5)
    wild = load_trace("wild")
    weave = Replay(wild, base, SimPolicy.make("weave"),
                   ReplayOptions(accounting=Accounting.CONSISTENT)).run()
    out: dict[str, Any] = {"where_wild": where(weave), "slices": {}}
    for name, trace in (("wild", wild),
                        ("seed11", generate_trace(GeneratorConfig(n_jobs=200, seed=11)))):
        out["slices"][name] = slices(trace, base)
    console = Console(width=150)
    w = out["where_wild"]
    t = Table(title=f"wild, weave, consistent: rollout bubble {100 * w['bubble']:.1f}%")
    for col in ("members", "rollout nodes", "share of rollout time", "idle (points)",
                "idle inside"):
        t.add_column(col, justify="right")
    for r in w["by_group"]:
        t.add_row(str(r["members"]), str(r["rollout_nodes"]),
                  f"{100 * r['share_of_rollout_time']:.1f}%", f"{r['idle_points']:.2f}",
                  f"{100 * r['idle_inside']:.1f}%")
    console.print(t)
    for key in ("pairs_bound", "fluid_bound"):
        console.print(f"{key}: bubble {100 * w[key]['bubble']:.1f}%, rollout node-time "
                      f"{w[key]['rollout_node_time']:.3f} of weave's")
    t = Table(title="rollout slices (consistent accounting)")
    for col in ("trace", "pool", "policy", "vs isolated", "vs co-located", "cost/bound",
                "bubble r / t", "over SLO"):
        t.add_column(col)
    for name, variants in out["slices"].items():
        for label, rows in variants.items():
            for pol, r in rows.items():
                t.add_row(name, label, pol, f"{r['vs_isolated']:.3f}x",
                          f"{r['vs_colocated']:.3f}x", f"{r['cost_over_bound']:.3f}",
                          f"{100 * r['bubble']['rollout']:.1f} / "
                          f"{100 * r['bubble']['train']:.1f}%",
                          f"{r['slo_violations']} / {r['life_slo_violations']}")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
