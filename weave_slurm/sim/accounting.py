"""Cost accounting: integrate paid nodes over time, and the reference's pure pieces.

General part: a usage series is a list of :class:`UsageSample` - from ``time_s`` on,
``nodes[pool]`` nodes are paid for, until the next sample. :func:`integrate_cost` prices
it with :class:`~weave_slurm.model.cost.CostRates` (price per node-hour per pool, the
same rates placement uses).

Reference part (``reference`` accounting mode; every fact is sourced in docs/traces.md):
cost rates 1.0 per h800 (training) node and 1/3 per h20 (rollout) node, integrated over
seconds, so reference costs are in *h800-node-seconds*; dollars use 8 x 5.28 $/h per h800
node. Job lifetimes are fixed by the trace. The two baselines charge per job, from
arrival to departure: isolated disaggregation one h20 + one h800 node, co-location one
h800 node, both doubled for a 32B job.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from weave_slurm.config.site import SiteConfig, parse_site
from weave_slurm.errors import ConfigError
from weave_slurm.model.cost import CostRates
from weave_slurm.sim.traces import EventKind, Trace, TraceJob
from weave_slurm.vocab import Pool

SECONDS_PER_HOUR = 3600.0

REFERENCE_TRAIN_NODE_RATE = 1.0
REFERENCE_ROLLOUT_NODE_RATE = 1.0 / 3.0
REFERENCE_H800_GPU_USD_PER_HOUR = 5.28
REFERENCE_GPUS_PER_NODE = 8
REFERENCE_SIMULATE_ITERATIONS = 100


def reference_unit_rates() -> CostRates:
    """The reference's relative rates: an h800 node costs 1, an h20 node 1/3 (per hour
    here; the reference integrates the same rates over seconds)."""
    return CostRates(rollout_node_hour=REFERENCE_ROLLOUT_NODE_RATE,
                     train_node_hour=REFERENCE_TRAIN_NODE_RATE)


def reference_usd_rates() -> CostRates:
    """Dollar rates of the reference plots: 8 x 5.28 $/h per h800 node, a third of that
    per h20 node."""
    h800 = REFERENCE_GPUS_PER_NODE * REFERENCE_H800_GPU_USD_PER_HOUR
    return CostRates(rollout_node_hour=h800 * REFERENCE_ROLLOUT_NODE_RATE,
                     train_node_hour=h800)


@dataclass(frozen=True, slots=True)
class UsageSample:
    """From ``time_s`` on (until the next sample), ``nodes[pool]`` nodes are paid for."""

    time_s: float
    nodes: Mapping[Pool, int]


def integrate_node_seconds(samples: Sequence[UsageSample], until_s: float | None = None
                           ) -> dict[Pool, float]:
    """Node-seconds per pool of a piecewise-constant usage series. The last sample holds
    until ``until_s`` (default: its own time, i.e. it adds nothing)."""
    totals: dict[Pool, float] = {}
    for index, sample in enumerate(samples):
        if index + 1 < len(samples):
            end_s = samples[index + 1].time_s
        else:
            end_s = sample.time_s if until_s is None else until_s
        span_s = end_s - sample.time_s
        if span_s < 0:
            raise ConfigError(f"usage sample {index + 1} at t={end_s!r} s is before sample "
                              f"{index} at t={sample.time_s!r} s; expected time order")
        for pool, count in sample.nodes.items():
            totals[pool] = totals.get(pool, 0.0) + count * span_s
    return totals


def integrate_cost(samples: Sequence[UsageSample], rates: CostRates,
                   until_s: float | None = None) -> float:
    """Total cost of a usage series (rates per node-hour, times in seconds)."""
    node_s = integrate_node_seconds(samples, until_s)
    return sum(rates.price(pool) * ns for pool, ns in node_s.items() if ns) / SECONDS_PER_HOUR


def group_cost_per_hour(train_nodes: int, rollout_nodes: int, rates: CostRates) -> float:
    """Hourly cost of one co-execution group."""
    return rates.rate(rollout_nodes, train_nodes)


def reference_group_rate(rollout_nodes: int, train_nodes: int = 1,
                         slowdowns: Iterable[float] = (), slos: Iterable[float] = ()
                         ) -> float:
    """The reference's ``per_time_cost`` rate of a group in h800-node units:
    ``train_nodes * 1.0 + rollout_nodes / 3``; when some member misses its SLO (as
    recomputed after a departure), the rate is multiplied by the largest slowdown among
    the members that miss it (``weave_scheduler.py``, ``per_time_cost`` with
    ``return_invalid=True``)."""
    rate = train_nodes * REFERENCE_TRAIN_NODE_RATE + rollout_nodes * REFERENCE_ROLLOUT_NODE_RATE
    missed = [s for s, slo in zip(slowdowns, slos, strict=True) if s >= slo]
    return rate * max(missed) if missed else rate


def slo_met(mean_iteration_s: float, solo_iteration_s: float, slo: float) -> bool:
    """The reference's validity test: mean iteration time strictly below
    ``slo x (t_rollout + t_train)`` (``per_time_cost``: ``>=`` is a violation)."""
    return mean_iteration_s < slo * solo_iteration_s


class Baseline(enum.Enum):
    """The reference's two baselines (``wild_trace_sim.py``, ``baseline``)."""

    ISOLATED = "isolated"  # "naive-d": a private h20 + h800 node pair per job
    COLOCATED = "colocated"  # "veRL": both phases on a private h800 node per job


def reference_node_multiplier(job: TraceJob) -> int:
    """Nodes per pool a baseline charges a job: 2 for a ``32B`` kind, else 1 (the
    reference tests ``job_type.startswith('32B')``)."""
    return 2 if job.kind is not None and job.kind.startswith("32B") else 1


def baseline_usage(trace: Trace, baseline: Baseline) -> list[UsageSample]:
    """Node counts after every trace event (in event order) for a baseline; a job still
    running at the end of the trace holds its nodes until the last event."""
    by_id = {job.job_id: job for job in trace.jobs}
    h20 = h800 = 0
    samples: list[UsageSample] = []
    for event in trace.events:
        sign = 1 if event.kind is EventKind.ARRIVAL else -1
        nodes = sign * reference_node_multiplier(by_id[event.job_id])
        h800 += nodes
        if baseline is Baseline.ISOLATED:
            h20 += nodes
        samples.append(UsageSample(event.time_s, {Pool.ROLLOUT: h20, Pool.TRAIN: h800}))
    return samples


def reference_baseline_cost(trace: Trace, baseline: Baseline) -> float:
    """A baseline's cost in h800-node-seconds, as the reference computes it."""
    node_s = integrate_node_seconds(baseline_usage(trace, baseline))
    return (node_s.get(Pool.TRAIN, 0.0) * REFERENCE_TRAIN_NODE_RATE
            + node_s.get(Pool.ROLLOUT, 0.0) * REFERENCE_ROLLOUT_NODE_RATE)


def baseline_iterations(job: TraceJob, baseline: Baseline) -> int | None:
    """Whole iterations a job completes in its lifetime on a baseline (the reference's
    throughput measure: ``floor(duration / (t_rollout + t_train))`` with the ``colo``
    profile for co-location, ``disagg`` for isolation)."""
    lifetime = job.lifetime_s
    if baseline is Baseline.COLOCATED:
        rollout, train = job.t_rollout_colo_s, job.t_train_colo_s
    else:
        rollout, train = job.t_rollout_s, job.t_train_s
    if lifetime is None or rollout is None or train is None:
        return None
    return math.floor(lifetime / (rollout + train))


#: The reference's accounting as a site (same numbers as configs/reference.toml): an
#: 8-GPU H800 node at 8 x 5.28 $/h, an H20 node at a third of it, no memory or pool limit.
REFERENCE_SITE_TOML = """
[site]
name = "reference"
currency = "USD"
default_slo = 1.5

[pools.rollout]
partition = "h20"
gpu = "h20"
gpus_per_node = 8
host_mem_gib = 1000000
price_per_gpu_hour = 1.76
max_nodes = 100000

[pools.train]
partition = "h800"
gpu = "h800"
gpus_per_node = 8
host_mem_gib = 1000000
price_per_gpu_hour = 5.28
max_nodes = 100000

[limits]
max_group_size = 5
max_rollout_nodes_per_group = 64
"""


def reference_site() -> SiteConfig:
    """The site `weave simulate` uses without ``--site`` (groups of up to 5, as the
    reference's wild replay; ``--max-group-size 3`` for its Philly experiments)."""
    return parse_site(REFERENCE_SITE_TOML, "<reference site>")
