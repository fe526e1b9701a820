"""What weaved's way of holding a pool costs (docs/simulator.md, "weaved's pools").

    .venv/bin/python bench/live_pool_rows.py [--trace wild] [--seed 1] [--json OUT]

Replays ``weave-live`` with pooled rollout (consistent accounting, groups of up to 5)
six times, each pool held by another rule (sim/live_pools.py):

- ``placement's width``: each pool on the GPUs placement asked for (no rows: what
  weave's own pooled replay charges);
- ``shares rounding only``: each change of a pool asks a new row of shares for its
  whole width (``placement.pooled.shares``): the rounding to equal shares of whole
  engines, no row kept;
- ``whole rows only``: rows kept until wholly spare, a wider pool adding one row (what
  weaved did before a pool could replace rows by a smaller one);
- ``replaced only beside them``: the above, and a pool's newest rows replaced by one
  smaller row where that pays (``placement.pool_shrink``) and the new row fits beside
  the rows it replaces, on their nodes;
- ``rows only``: the above, the new row also where the rollout pool's free GPUs hold
  it (what weaved did before it shrank rows by nodes);
- ``as weaved holds it``: the replay's own rule, what ``weave simulate --rollout pooled
  --policy weave-live`` reports: as ``rows only``, but a narrower pool first gives back
  the single nodes of its rows it can spare (``held_pool``'s ``shrink_nodes``: Slurm
  shrinks a running allocation by nodes, ``scontrol update JobId=X NodeList=...``),
  newest rows first.

Only the last is what weaved does; the others say where its cost comes from.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.live_pools import LivePools
from weave_slurm.sim.loader import load_trace
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions
from weave_slurm.sim.slo import SloDistribution


class PlacementWidth(LivePools):
    """Each pool on placement's width (module doc)."""

    def hold(self, before: ClusterState, after: ClusterState,
             remaining_s: Mapping[str, float] | None = None) -> ClusterState:
        return after

    @staticmethod
    def recharged(before: ClusterState, after: ClusterState,
                  charged: Mapping[str, float]) -> dict[str, float]:
        return dict(charged)


class RoundingOnly(LivePools):
    """Each change of a pool a new row for its whole width (module doc)."""

    def hold(self, before: ClusterState, after: ClusterState,
             remaining_s: Mapping[str, float] | None = None) -> ClusterState:
        self.held.clear()
        return super().hold(before, after, remaining_s)


class WholeRows(LivePools):
    """Rows returned whole only, never replaced (what weaved did before a pool could
    replace rows by a smaller one)."""

    def __init__(self) -> None:
        super().__init__(replace_rows=False, shrink_nodes=False)


class BesideOnly(LivePools):
    """Rows replaced only where the new row fits beside them, on their nodes."""

    def __init__(self) -> None:
        super().__init__(beside_only=True, shrink_nodes=False)


class RowsOnly(LivePools):
    """Rows returned or replaced, never shrunk by nodes (what weaved did before)."""

    def __init__(self) -> None:
        super().__init__(shrink_nodes=False)


RULES: dict[str, type[LivePools]] = {"placement's width": PlacementWidth,
                                     "shares rounding only": RoundingOnly,
                                     "whole rows only": WholeRows,
                                     "replaced only beside them": BesideOnly,
                                     "rows only (weaved before)": RowsOnly,
                                     "as weaved holds it (rows shrunk by nodes)": LivePools}


def run(trace_name: str, seed: int) -> dict[str, Any]:
    trace = load_trace(trace_name, slo=SloDistribution.parse("uniform:1.1,2"), seed=seed)
    cap = Capacity.from_site(reference_site(), 5, pooled=True)
    opts = ReplayOptions(accounting=Accounting.CONSISTENT, seed=seed)
    out: dict[str, Any] = {}
    for name, rule in RULES.items():
        replay = Replay(trace, cap, SimPolicy.make("weave-live", seed), opts)
        replay.pools = rule()
        r = replay.run()
        out[name] = {"cost": r.cost, "migrations": r.migrations, "repins": r.repins,
                     "bubble": {p: 1 - r.busy_node_s[p] / r.node_s[p]
                                for p in r.node_s if r.node_s[p]}}
    iso = Replay(trace, cap, SimPolicy.make("isolated", seed), opts).run().cost
    for v in out.values():
        v["vs_isolated"] = iso / v["cost"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="wild")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = run(args.trace, args.seed)
    table = Table(title=f"weave-live pooled on {args.trace} (seed {args.seed})")
    for col in ("pools held", "cost", "vs isolated", "bubble r / t", "moves / re-pins"):
        table.add_column(col, justify="left" if col == "pools held" else "right")
    for name, v in out.items():
        b = v["bubble"]
        table.add_row(name, f"{v['cost']:,.0f}", f"{v['vs_isolated']:.3f}x",
                      f"{100 * b.get('rollout', 0):.1f} / {100 * b.get('train', 0):.1f}%",
                      f"{v['migrations']} / {v['repins']}")
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
