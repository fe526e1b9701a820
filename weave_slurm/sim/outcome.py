"""What a replay produces: per-job books, group segments and the raw result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Group
from weave_slurm.sim.bound import WorkBound
from weave_slurm.sim.policies import Accounting
from weave_slurm.sim.traces import TraceJob


@dataclass(frozen=True, slots=True)
class Segment:
    """A group with constant membership from ``start_s`` to ``end_s``."""

    group: Group
    start_s: float
    end_s: float


@dataclass(slots=True)
class JobRun:
    """Book-keeping of one job during a replay (mutable, internal to the replay)."""

    job: TraceJob
    planned: JobProfile  # what placement was told
    actual: JobProfile  # what the job really does now (drift)
    arrival_s: float
    work: float  # iterations to complete (consistent) or inf (reference)
    done: float = 0.0
    since_s: float = 0.0
    rate: float = 0.0  # iterations per second
    slowdown: float = 1.0
    violated: bool = False
    group_id: int | None = None
    admission: str = ""
    departure_s: float | None = None
    paused_until_s: float = 0.0
    handle: int | None = None
    slowdown_s: float = 0.0  # integral of slowdown over time
    violated_s: float = 0.0
    max_slowdown: float = 1.0
    lost_iterations: float = 0.0
    migrations: int = 0
    paused_s: float = 0.0  # charged for moves
    solo_done_s: float = 0.0  # what the iterations done would have taken alone
    failures: int = 0
    ever_violated: bool = False

    def remaining_s(self, now: float) -> float:
        """Seconds until the job's work is done at its current rate (inf if unknown)."""
        self.settle(now)
        left = max(0.0, self.work - self.done)
        pause = max(0.0, self.paused_until_s - now)
        return (left / self.rate if self.rate > 0 else math.inf) + pause

    def settle(self, now: float) -> None:
        dt = now - self.since_s
        if dt <= 0:
            return
        run_dt = now - max(self.since_s, min(now, self.paused_until_s))
        self.done += self.rate * run_dt
        self.solo_done_s += self.rate * run_dt * self.actual.solo_mean_s
        self.slowdown_s += self.slowdown * dt
        if self.violated:
            self.violated_s += dt
        self.since_s = now


@dataclass
class ReplayResult:
    """Raw outcome of one policy's replay; :mod:`weave_slurm.sim.report` summarises it."""

    policy: str
    accounting: Accounting
    capacity: Capacity
    start_s: float
    end_s: float
    node_s: dict[str, float]  # node-seconds per pool ("rollout", "train")
    busy_node_s: dict[str, float]
    cost: float  # site currency
    reference_units: float  # h800-node-seconds at 1 / (1/3)
    peak_nodes: dict[str, float]  # a pooled group's rollout GPUs count as node shares
    series: list[tuple[float, float, int, float]]  # (t, rollout nodes, train nodes, cost/h)
    runs: dict[str, JobRun]
    admissions: dict[str, int]
    placement_s: list[float]
    segments: list[Segment]
    migrations: int = 0
    repins: int = 0  # members re-pinned inside their group by a re-plan
    replans: int = 0  # charged re-plans taken
    refusals: int = 0
    failures: int = 0
    regroups: int = 0
    optimum_fallbacks: int = 0
    # rollout node-seconds of pools' replaced rows held beside their new rows, paid and
    # idle, in no segment (weave-live's pools: sim/live_pools.py)
    held_longer_node_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    bound: WorkBound | None = None  # the zero-bubble lower bound (sim/bound.py)
