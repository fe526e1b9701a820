"""Chaos: weaved killed again and again, a node DOWN, a stopped slurmd and a flooding user,
all at once, on a Slurm cluster of separate hosts (as root).

    python bench/chaos.py --json bench/results/chaos.json
    python bench/chaos.py --kills 5 --cluster-state /srv/c     # a cluster that is up

The scenario is the CI test's (tests/reliability/chaos.py, ``run_chaos``; asserted by
tests/reliability/test_chaos.py): root submits small reference GRPO jobs; once one
trains, its group's rollout node is set DOWN and weaved SIGKILLed and started again on
the same state; with the node still DOWN, another group's training node's slurmd is
stopped for ``--slurmd-stop-s``; then weaved is killed again, ``--kills`` times in all;
meanwhile
``weave-test-a`` floods weaved (held connections, pings, submissions bounded by the
site's ``[limits.user]``) and ``weave-test-b`` submits one job after it. Prints a
table (jobs, kills, lost, duplicated, recovery after each kill, the second users'
waits) and writes it as JSON; exits 1 if a job was lost, listed twice, did not
complete with its solo weights, or something was left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.*
from bench.soak import slurm_cluster
from tests.harness.scratch import python_open_to_users
from tests.reliability.chaos import ChaosPlan, ChaosReport, chaos_place, run_chaos
from tests.reliability.conftest import made_users


def _waits(rep: ChaosReport, owner: str) -> list[float]:
    return [s for j, s in rep.placed_s.items() if rep.owners.get(j) == owner]


def summary(rep: ChaosReport) -> dict[str, Any]:
    flood, quiet = _waits(rep, "flood"), _waits(rep, "quiet")
    bad = [j for j, ok in rep.digests_equal.items() if not ok]
    return {
        "jobs": len(rep.jobs), "kills": len(rep.kills), "lost": len(rep.lost),
        "duplicated": len(rep.duplicated),
        "completed": sum(r["state"] == "COMPLETED" for r in rep.jobs.values()),
        "weights_differ": len(bad) + sum(j not in rep.digests_equal for j in rep.jobs),
        "flood_accepted": sum(o == "flood" for o in rep.owners.values()),
        "flood_refused": len(rep.refused),
        "answer_s": [round(k.answer_s, 2) for k in rep.kills],
        "recovery_s": [round(k.progress_s, 2) for k in rep.kills],
        "quiet_wait_s": round(quiet[0], 2) if quiet else None,
        "flood_wait_mean_s": round(statistics.mean(flood), 2) if flood else None,
        "zombies": len(rep.zombies), "processes_left": rep.processes_left,
        "segments_left": sum(len(v) for v in rep.segments_left.values()),
        "other_shm_files_left": sum(len(v) for v in rep.shm_left.values()),
        "wall_s": round(rep.wall_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=ChaosPlan.kills)
    ap.add_argument("--root-steps", type=int, default=ChaosPlan.root_steps)
    ap.add_argument("--flood-jobs", type=int, default=ChaosPlan.flood_jobs)
    ap.add_argument("--slurmd-stop-s", type=float, default=ChaosPlan.slurmd_stop_s)
    ap.add_argument("--cluster-state", type=Path, default=None,
                    help="the separate-hosts cluster to use (default: bring one up)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's state dir")
    ap.add_argument("--json", type=Path, default=Path("bench/results/chaos.json"))
    args = ap.parse_args()
    plan = ChaosPlan(kills=args.kills, root_steps=args.root_steps, flood_jobs=args.flood_jobs,
                     slurmd_stop_s=args.slurmd_stop_s)
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(slurm_cluster(args.cluster_state, args.keep))
        flooder, quiet = stack.enter_context(made_users())
        stack.enter_context(python_open_to_users())
        place = stack.enter_context(chaos_place(cluster, dict(cluster.env), show_log=False))
        rep = run_chaos(place, flooder, quiet, plan)
    out = summary(rep)
    table = Table(title=f"chaos: {out['kills']} kills, {rep.down_node} DOWN, slurmd of "
                  f"{rep.stopped_slurmd} stopped, a flood")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k, v in out.items():
        table.add_row(k, str(v))
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": out, "report": rep.as_json()}, indent=1,
                                    default=str))
    failed = out["lost"] or out["duplicated"] or out["weights_differ"] or out["zombies"] \
        or out["processes_left"] or out["segments_left"] or out["completed"] != out["jobs"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
