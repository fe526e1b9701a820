"""Warm switch of a 2-rank training gang vs a cold start of the same gang.

One member of the reference GRPO job whose layout is 1 training node x ``--ranks``
ranks (FSDP2 over gloo, one resident worker per rank), in a group on local node
daemons. Its training phases after the first are **warm**: the ranks' workers are
resident, their world is kept, the model built and the state held. Then the member is
failed on purpose during a rollout (``GroupRunner.fail``): its recovery drops the gang's workers and
shm state (checkpoints kept), so its next training phase is a **cold** start of the
same work: new worker processes, a new process group (rendezvous), the job's model
build and each rank's checkpoint load (restore into shm, ``load_state``), then the
same kind of training step. Both are the runner's own phase spans (activation to
every rank's end). Compare the ratio measured in one run; the VM is shared and noisy.

    python bench/gang_switch.py --json bench/results/gang_switch.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.fleet import running_fleet
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Fail, Leave
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.vocab import Phase

OPTIONS = {"prompts_per_step": 4, "group_size": 4}


def run(ranks: int, warm_steps: int) -> dict[str, object]:
    spec = MemberSpec("gang", seed=7, steps=warm_steps + 3, options=OPTIONS,
                      layout=MemberLayout(TrainLayout((ranks,)), RolloutLayout(1, (1,))))
    with tempfile.TemporaryDirectory(prefix="weave-bench-gang-") as tmp, \
            running_fleet(Path(tmp), "bench_gang", "weave-bench-gang-") as fleet:
        ex = GroupRunner(fleet.layout, [spec])  # type: ignore[arg-type]
        failed: list[float] = []     # when it was failed (the runner's clock)

        def fail_once(runner: GroupRunner) -> None:
            m = runner.members["gang"]
            if not failed and m.version >= warm_steps + 1 and Phase.ROLLOUT in m.runs:
                failed.append(runner.clock.now())
                GroupPort(runner).apply(Fail("gang", Fault(
                    FaultKind.PHASE_FAILED, "h800-0", Phase.TRAIN,
                    evidence="bench: a cold start on purpose")))
        try:
            ex.run(timeout_s=900, on_tick=fail_once)
        finally:
            if "gang" in GroupPort(ex).order:
                GroupPort(ex).apply(Leave("gang"))
            ex.close()
    spans = sorted((s for s in ex.spans if s.kind is Phase.TRAIN and s.ok and not s.init),
                   key=lambda s: s.start_s)
    assert failed, "the member was never failed"
    fail_at = failed[0]
    warm = [s.end_s - s.start_s for s in spans if s.end_s <= fail_at][1:]   # not the first
    cold = [s.end_s - s.start_s for s in spans if s.start_s > fail_at][:1]
    gang = ex.members["gang"].gang
    return {"ranks": ranks, "warm_s": warm, "warm_median_s": statistics.median(warm),
            "cold_s": cold[0], "ratio": cold[0] / statistics.median(warm),
            "formations": gang.formations if gang else None,
            "state": ex.members["gang"].state.value}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="training ranks on one node")
    parser.add_argument("--warm-steps", type=int, default=4, help="warm steps measured")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    got = run(args.ranks, args.warm_steps)
    table = Table(title=f"gang of {args.ranks} ranks: warm switch vs cold start (train phase)")
    for col in ("warm median s", "warm runs", "cold s", "cold / warm", "worlds formed"):
        table.add_column(col)
    table.add_row(f"{got['warm_median_s']:.3f}", ", ".join(f"{x:.2f}" for x in
                                                         got["warm_s"]),  # type: ignore[attr-defined]
                  f"{got['cold_s']:.3f}", f"{got['ratio']:.2f}x", str(got["formations"]))
    Console().print(table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(got, indent=2) + "\n")
    return 0 if got["state"] == "DONE" else 1


if __name__ == "__main__":
    raise SystemExit(main())
