"""The zero-bubble lower bound of a replay: what the jobs' busy phase time alone costs.

Every iteration of a job occupies ``rollout_nodes`` h20 nodes for its expected rollout
and ``train_nodes`` h800 nodes for its training step, whatever policy runs it; a pool
can never be paid for less than that. The bound charges exactly that busy time, with
no bubble and no SLO slack spent (every job at its solo speed), for the work the trace
asks of each job:

- ``consistent`` accounting: the job's fixed work (``lifetime / solo iteration`` or the
  trace's ``iterations``); a job with no end runs at solo speed to the trace's end;
- ``reference`` accounting: the lifetime from the trace at solo speed, the same
  iterations (a policy that slows jobs does less work there, so its cost may fall
  below this bound; ``delivered`` prices the iterations it did complete instead).

Node shapes are the grouped ones (a 32B job: two h20 nodes and one h800 node) for
every policy, so the bound is one number per trace and options. It is exact for
disaggregated execution; co-location runs both phases on h800 nodes with its own
phase times, so its ratio says how far it is from the disaggregated limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import JobProfile
from weave_slurm.sim.accounting import (
    REFERENCE_ROLLOUT_NODE_RATE,
    REFERENCE_TRAIN_NODE_RATE,
    SECONDS_PER_HOUR,
)
from weave_slurm.sim.policies import Accounting, job_profile, job_work
from weave_slurm.sim.traces import Trace

POOLS = ("rollout", "train")


@dataclass(frozen=True, slots=True)
class IterationBusy:
    """Node-seconds one iteration of a job keeps busy in each pool."""

    rollout_node_s: float
    train_node_s: float

    @classmethod
    def of(cls, p: JobProfile) -> IterationBusy:
        return cls(p.rollout_mean_s * p.rollout_nodes, p.train_mean_s * p.train_nodes)

    def cost(self, rates: CostRates) -> dict[str, float]:
        """Cost of the busy time of one iteration per pool (rates per node-hour)."""
        return {"rollout": self.rollout_node_s * rates.rollout_node_hour / SECONDS_PER_HOUR,
                "train": self.train_node_s * rates.train_node_hour / SECONDS_PER_HOUR}

    @property
    def reference_units(self) -> float:
        """h800-node-seconds (an h800 node 1, an h20 node 1/3)."""
        return (self.rollout_node_s * REFERENCE_ROLLOUT_NODE_RATE
                + self.train_node_s * REFERENCE_TRAIN_NODE_RATE)


@dataclass(frozen=True, slots=True)
class JobWork:
    """One job as the bound sees it: solo-speed iterations and their busy time."""

    job_id: str
    iterations: float
    busy: IterationBusy


@dataclass(frozen=True, slots=True)
class WorkBound:
    """Busy-time cost per pool (site currency) and in h800-node-seconds."""

    pools: Mapping[str, float]
    reference_units: float
    per_iteration: Mapping[str, IterationBusy]  # by job id, to price delivered work

    @property
    def total(self) -> float:
        return sum(self.pools.values())

    def delivered(self, done: Mapping[str, float], rates: CostRates) -> float:
        """Busy-time cost of the iterations a policy actually completed."""
        total = 0.0
        for job_id, iterations in done.items():
            busy = self.per_iteration.get(job_id)
            if busy is not None:
                total += iterations * sum(busy.cost(rates).values())
        return total


def work_bound(jobs: Iterable[JobWork], rates: CostRates) -> WorkBound:
    """The bound of a set of jobs (see the module docstring)."""
    pools = dict.fromkeys(POOLS, 0.0)
    units = 0.0
    per_iteration: dict[str, IterationBusy] = {}
    for job in jobs:
        per_iteration[job.job_id] = job.busy
        if not math.isfinite(job.iterations) or job.iterations <= 0:
            continue
        for pool, cost in job.busy.cost(rates).items():
            pools[pool] += job.iterations * cost
        units += job.iterations * job.busy.reference_units
    return WorkBound(pools, units, per_iteration)


def trace_bound(trace: Trace, rates: CostRates, accounting: Accounting,
                rollout_mean_fraction: float = 1.0,
                staleness_of: Callable[[str], int] = lambda _job_id: 0) -> WorkBound:
    """The bound of a trace under a replay's options (module docstring)."""
    jobs = []
    for job in trace.jobs:
        p = job_profile(job, "weave", accounting, rollout_mean_fraction,
                        staleness_of(job.job_id))
        work = job_work(job, p, accounting)
        if not math.isfinite(work):
            life = job.lifetime_s
            if life is None:
                life = max(0.0, trace.end_s - job.arrival_s)
            work = life / p.solo_mean_s
        jobs.append(JobWork(job.job_id, work, IterationBusy.of(p)))
    return work_bound(jobs, rates)


def ratios(cost: float, pool_cost: Mapping[str, float] | None, bound: WorkBound,
           delivered: float) -> dict[str, float | None]:
    """Cost over bound overall, per pool (None where a policy has no per-pool cost) and
    over the busy cost of the work it delivered."""
    out: dict[str, float | None] = {
        "total": cost / bound.total if bound.total > 0 else None,
        "delivered": cost / delivered if delivered > 0 else None}
    for pool in POOLS:
        b = bound.pools.get(pool, 0.0)
        out[pool] = (pool_cost[pool] / b if pool_cost is not None and b > 0 else None)
    return out
