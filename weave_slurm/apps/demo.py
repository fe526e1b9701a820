"""The demo run behind ``weave demo``: three reference GRPO jobs grouped, then isolated.

Everything runs for real through ``weaved`` on the embedded LocalBackend: the daemon
runs in this process (temp state dir and socket), the jobs are submitted over its
socket as ``weave-sbatch`` sends them, placement groups them, weaved allocates the
group's virtual nodes, starts their node daemons and its group runtime runs the
members round-robin. Grouped: the three jobs share one group. Isolated: each job is
submitted alone (its own group), one after another.
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import StateError
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.timeline import Span, busy_fraction, gantt_png
from weave_slurm.vocab import Phase, Pool

JOB_NAMES = ("grpo-a", "grpo-b", "grpo-c")
TASKS = ("copy", "reverse", "copy")
#: Two-digit prompts: the toy learns them within the demo's 20 steps (batch mean reward
#: of 5 steps from ~0.10, chance, to ~0.31-0.35 at steps 15-19 and ~0.40 at 25-29, for
#: each of the three jobs, measured solo with seeds 0-2; the default four digits need
#: ~80 steps for as much).
DEMO_OPTIONS = {"prompt_len": 2}


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
    busy: Path         # the pools' busy fractions, grouped vs isolated
    # each job's usage record as ``weave sacct --json`` gives it (docs/accounting.md)
    usage: list[dict[str, Any]] = field(default_factory=list)


def demo_members(steps: int, suffix: str = "") -> list[MemberSpec]:
    return [MemberSpec(name + suffix, seed=i, steps=steps,
                       options={"task": task, **DEMO_OPTIONS})
            for i, (name, task) in enumerate(zip(JOB_NAMES, TASKS, strict=True))]


def _steady(spans: list[Span], first_rollout_s: float) -> list[Span]:
    return [s for s in spans if s.end_s > first_rollout_s]


def stats(runs: list[list[Span]], rollout: list[str], train: list[str]) -> RunStats:
    """Steady-window wall time and busy fractions; several runs are laid end to end."""
    wall = busy_r = busy_t = 0.0
    for spans in runs:
        firsts: dict[str, float] = {}
        for s in sorted(spans, key=lambda s: s.end_s):
            if s.kind is Phase.ROLLOUT:
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


def busy_png(grouped: RunStats, isolated: RunStats | None, path: Path) -> Path:
    """The pools' busy fractions, grouped against isolated (the steady window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [("grouped", grouped)] + ([("isolated", isolated)] if isolated else [])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(runs)
    for i, (name, st) in enumerate(runs):
        xs = [k + (i - (len(runs) - 1) / 2) * width for k in range(2)]
        bars = ax.bar(xs, [st.rollout_busy, st.train_busy], width, label=name)
        ax.bar_label(bars, labels=[f"{st.rollout_busy:.0%}", f"{st.train_busy:.0%}"],
                     fontsize=8)
    ax.set_xticks(range(2), ["h20 (rollout)", "h800 (train)"])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("busy fraction of the pool's node-time")
    ax.set_title("weave demo: pools busy, grouped vs isolated (steady window)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def demo_spec(name: str, seed: int, task: str, steps: int) -> str:
    """The spec TOML of one reference GRPO job, as ``weave-sbatch JOB.toml`` sends it."""
    return job_spec_toml(name, entry="builtin:grpo-toy", iterations=steps, seed=seed,
                         options={"task": task, **DEMO_OPTIONS})


class _Daemon:
    """weaved in this process (LocalBackend, temp state dir and socket)."""

    def __init__(self, state_dir: Path, shm: Path) -> None:
        from weave_slurm.daemon.driver import DriverKind
        from weave_slurm.daemon.group_runtime import GroupRuntime
        from weave_slurm.daemon.service import DaemonConfig, Weaved

        self.weaved = Weaved(DaemonConfig(state_dir=state_dir, tick_s=0.2, shm_root=shm,
                                          runtime=DriverKind.RL, client_timeout_s=10.0))
        if not isinstance(self.weaved.driver, GroupRuntime):
            raise StateError("weave demo: weaved did not start the group runtime")
        self.runtime = self.weaved.driver
        self.thread = threading.Thread(target=self.weaved.run, name="weaved", daemon=True)
        self.thread.start()

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        with DaemonClient(self.weaved.config.socket) as client:
            return client.call(op, **args)

    def run(self, specs: list[tuple[str, str]], on_status: _OnStatus | None,
            timeout_s: float) -> tuple[list[dict[str, Any]], list[Span]]:
        """Submit ``(name, spec)``s, follow them to the end; their rows and spans."""
        ids = [int(self.call(Op.SUBMIT, spec=text, source=f"{name}.toml")["job"])
               for name, text in specs]
        end = time.monotonic() + timeout_s
        while True:
            rows = self.call(Op.STATUS, jobs=ids)["jobs"]
            if on_status is not None:
                on_status(rows)
            if all(r["state"] in _FINAL for r in rows):
                break
            if time.monotonic() > end:
                raise StateError(f"weave demo: jobs not done after {timeout_s:.0f} s: "
                                 + ", ".join(f"{r['job']}={r['state']}" for r in rows))
            time.sleep(0.25)
        bad = [r for r in rows if r["state"] != "COMPLETED"]
        if bad:
            raise StateError(f"weave demo: job {bad[0]['job']} {bad[0]['state']}: "
                             f"{bad[0]['reason']}")
        names = {str(r["job"]): str(r["name"]) for r in rows}   # spans by job name
        spans = [replace(s, job_id=names.get(s.job_id, s.job_id))
                 for gid in {r["group"] for r in rows}
                 for s in self.runtime.spans.get(int(gid), [])]
        return rows, spans

    def usage(self, ids: list[int], timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The jobs' usage records once each is booked to its end (``weave sacct``)."""
        end = time.monotonic() + timeout_s
        while True:
            records = self.call(Op.SACCT, jobs=ids)["jobs"]
            if all(r["updated_s"] is not None and r["ended_s"] is not None
                   and r["updated_s"] >= r["ended_s"] for r in records) \
                    or time.monotonic() > end:
                return list(records)
            time.sleep(0.25)

    def stop(self) -> None:
        self.weaved.stop()
        self.thread.join(timeout=60)


_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "REFUSED")
_OnStatus = Callable[[list[dict[str, Any]]], None]


def run_demo(steps: int, out: Path, *, isolated: bool = True,
             on_status: _OnStatus | None = None,
             on_phase: Callable[[str], None] | None = None,
             timeout_s: float = 900.0) -> DemoResult:
    """Run the grouped (and isolated) demo through weaved; PNGs and ``summary.json``."""
    out.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="weave-demo-"))
    state.chmod(0o755)
    shm = Path(tempfile.mkdtemp(prefix="weave-demo-", dir="/dev/shm"))
    os.chmod(shm, 0o711)
    if on_phase:
        on_phase("starting weaved (LocalBackend: 2 h20 + 2 h800 virtual nodes)")
    daemon = _Daemon(state / "weaved", shm)
    try:
        if on_phase:
            on_phase(f"grouped: {len(JOB_NAMES)} jobs x {steps} steps submitted to weaved")
        specs = [(n, demo_spec(n, i, t, steps))
                 for i, (n, t) in enumerate(zip(JOB_NAMES, TASKS, strict=True))]
        rows, grouped_spans = daemon.run(specs, on_status, timeout_s)
        ids = [int(r["job"]) for r in rows]
        groups = {r["group"] for r in rows}
        rewards = {r["name"]: list((daemon.runtime.live(int(r["job"])) or {}).get(
            "rewards", [])) for r in rows}
        iso_runs: list[list[Span]] = []
        if isolated:
            for i, (name, task) in enumerate(zip(JOB_NAMES, TASKS, strict=True)):
                if on_phase:
                    on_phase(f"isolated: {name} alone")
                alone, spans = daemon.run([(f"{name}-alone", demo_spec(f"{name}-alone", i,
                                                                       task, steps))],
                                          on_status, timeout_s)
                iso_runs.append(spans)
                ids += [int(r["job"]) for r in alone]
        usage = daemon.usage(ids)
    finally:
        daemon.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    rollout = sorted({s.node for s in grouped_spans if s.pool is Pool.ROLLOUT})
    train = sorted({s.node for s in grouped_spans if s.pool is Pool.TRAIN})
    grouped = stats([grouped_spans], rollout, train)
    iso = stats(iso_runs, rollout, train) if iso_runs else None
    gantt = gantt_png(grouped_spans, out / "gantt.png",
                      "weave demo: three GRPO jobs in one group")
    curves = reward_png(rewards, out / "rewards.png")
    busy = busy_png(grouped, iso, out / "busy.png")
    summary = out / "summary.json"
    summary.write_text(json.dumps({
        "steps": steps, "options": DEMO_OPTIONS, "rewards": rewards, "grouped": grouped.to_json(),
        "isolated": iso.to_json() if iso else None, "groups": sorted(groups),
        "via": "weaved (in-process, LocalBackend), jobs submitted over its socket",
        "window": "from every job's first rollout done to the end (model builds excluded)",
        "spans": [s.to_json() for s in grouped_spans], "usage": usage}, indent=1))
    return DemoResult(rewards, grouped, iso, gantt, curves, summary, busy, usage)
