"""The demo run behind ``weave demo``: three reference GRPO jobs grouped, then isolated.

Everything runs for real on the embedded LocalBackend: one h20 and one h800 virtual
node, each with its node daemon as a local process; the group executor drives them
(``weaved`` is not in the loop yet). Grouped: the three jobs share both nodes in
cyclic round-robin. Isolated: each job alone on the same two nodes, one after another.
Busy fractions and wall times are measured over the *steady window* of each run:
from the moment every job of the run has finished its first rollout to the end, so
each job's one-off model builds in its fresh resident workers (the ``init`` train
phase and the first rollout, ~5 s each on 2 cores) are left out of both sides alike.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.runtime.executor import GroupExecutor
from weave_slurm.runtime.fleet import FleetConfig, NodeFleet
from weave_slurm.runtime.group import MemberSpec, PhaseKind, Pool
from weave_slurm.runtime.timeline import Span, busy_fraction, gantt_png
from weave_slurm.slurm.local_backend import LocalBackend

JOB_NAMES = ("grpo-a", "grpo-b", "grpo-c")
TASKS = ("copy", "reverse", "copy")


@dataclass(frozen=True)
class RunStats:
    wall_s: float
    rollout_busy: float
    train_busy: float

    def to_json(self) -> dict[str, float]:
        return {"wall_s": self.wall_s, "rollout_busy": self.rollout_busy,
                "train_busy": self.train_busy}


@dataclass(frozen=True)
class DemoResult:
    rewards: dict[str, list[float]]
    grouped: RunStats
    isolated: RunStats | None
    gantt: Path
    curves: Path
    summary: Path


def demo_members(steps: int, suffix: str = "") -> list[MemberSpec]:
    return [MemberSpec(name + suffix, seed=i, steps=steps, options={"task": task})
            for i, (name, task) in enumerate(zip(JOB_NAMES, TASKS, strict=True))]


def _steady(spans: list[Span], first_rollout_s: float) -> list[Span]:
    return [s for s in spans if s.end_s > first_rollout_s]


def stats(runs: list[list[Span]], rollout: list[str], train: list[str]) -> RunStats:
    """Steady-window wall time and busy fractions; several runs are laid end to end."""
    wall = busy_r = busy_t = 0.0
    for spans in runs:
        firsts: dict[str, float] = {}
        for s in sorted(spans, key=lambda s: s.end_s):
            if s.kind is PhaseKind.ROLLOUT:
                firsts.setdefault(s.job_id, s.end_s)
        start = max(firsts.values())
        end = max(s.end_s for s in spans)
        steady = _steady(spans, start)
        clipped = [Span(s.job_id, s.kind, s.node, s.pool, max(s.start_s, start), s.end_s, s.ok)
                   for s in steady]
        w = end - start
        wall += w
        busy_r += busy_fraction(clipped, Pool.ROLLOUT, rollout, start, end) * w
        busy_t += busy_fraction(clipped, Pool.TRAIN, train, start, end) * w
    return RunStats(wall, busy_r / wall if wall else 0.0, busy_t / wall if wall else 0.0)


def reward_png(rewards: dict[str, list[float]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for job, ys in rewards.items():
        ax.plot(range(len(ys)), ys, label=job)
    ax.set_xlabel("step (weight version)")
    ax.set_ylabel("batch mean reward")
    ax.set_title("weave demo: reward per job (grouped run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_demo(steps: int, out: Path, *, isolated: bool = True,
             on_tick: Callable[[GroupExecutor], None] | None = None,
             on_phase: Callable[[str], None] | None = None) -> DemoResult:
    """Run the grouped (and isolated) demo; writes PNGs and ``summary.json`` to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    shm = Path(tempfile.mkdtemp(prefix="weave-demo-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    fleet = NodeFleet(LocalBackend(out / "backend"), FleetConfig("demo", shm, out / "state"))
    try:
        if on_phase:
            on_phase("starting two node daemons (h20-0, h800-0) on the LocalBackend")
        layout = fleet.start()
        rollout = [n.name for n in layout.rollout]
        train = [n.name for n in layout.train]
        if on_phase:
            on_phase(f"grouped: {len(JOB_NAMES)} jobs x {steps} steps")
        ex = GroupExecutor(layout, demo_members(steps))
        try:
            ex.run(on_tick=on_tick)
            rewards = {j: list(m.rewards) for j, m in ex.members.items()}
            grouped_spans = list(ex.spans)
        finally:
            for job in list(ex.order):
                ex.leave(job)
            ex.close()
        iso_runs: list[list[Span]] = []
        if isolated:
            for spec in demo_members(steps, "-alone"):
                if on_phase:
                    on_phase(f"isolated: {spec.job_id} alone")
                solo = GroupExecutor(layout, [spec])
                try:
                    solo.run(on_tick=on_tick)
                    iso_runs.append(list(solo.spans))
                finally:
                    solo.leave(spec.job_id)
                    solo.close()
    finally:
        fleet.stop()
        shutil.rmtree(shm, ignore_errors=True)
    grouped = stats([grouped_spans], rollout, train)
    iso = stats(iso_runs, rollout, train) if iso_runs else None
    gantt = gantt_png(grouped_spans, out / "gantt.png",
                      "weave demo: three GRPO jobs in one group (hatched = train)")
    curves = reward_png(rewards, out / "rewards.png")
    summary = out / "summary.json"
    summary.write_text(json.dumps({
        "steps": steps, "rewards": rewards, "grouped": grouped.to_json(),
        "isolated": iso.to_json() if iso else None,
        "window": "from every job's first rollout done to the end (model builds excluded)",
        "spans": [s.to_json() for s in grouped_spans]}, indent=1))
    return DemoResult(rewards, grouped, iso, gantt, curves, summary)
