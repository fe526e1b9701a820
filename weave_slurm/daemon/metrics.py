"""weaved's Prometheus endpoint (``weave daemon --metrics-port N``), off by default.

Each weaved has a registry of its own (:class:`WeavedMetrics`; several weaved run in
one test process), served by ``prometheus_client``'s HTTP server on
``--metrics-addr`` (default 127.0.0.1: the numbers are the site's, not the world's).
This module imports ``prometheus_client``, so weaved imports it only when metrics are
on. Nothing is kept in sync by hand: the counts are read from the store and the
bubbles from the live group runners at each scrape (:class:`_StateCollector`); the
histograms and counters are fed by two small hooks, the reconcile loop's placement
(``Reconciler.on_placement``) and the runtime's timeline
(:class:`~weave_slurm.runtime.timeline.TimelineObserver`).

Metrics (docs/deploy.md has the table): ``weave_jobs{state}``, ``weave_groups{state}``,
``weave_allocations{role,partition,state}``, ``weave_allocated_nodes{role,partition}``,
``weave_pool_bubble_ratio{pool}``, ``weave_group_bubble_ratio{group,pool}`` (gauges,
at scrape); ``weave_placement_latency_seconds`` and ``weave_phase_switch_seconds{phase}``
(histograms); ``weave_sync_bytes_total``, ``weave_sync_seconds_total`` and
``weave_syncs_total`` by ``what`` (weights, trajectories) (counters).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from weave_slurm.clock import Clock
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.group import GroupLayout
from weave_slurm.runtime.timeline import Span, busy_fraction, switch_gap_s
from weave_slurm.vocab import Pool

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


class Timeline(Protocol):
    """What the bubbles read of a running group (its port's read side)."""

    @property
    def spans(self) -> list[Span]: ...

    @property
    def layout(self) -> GroupLayout: ...

    @property
    def clock(self) -> Clock: ...

    def in_flight(self, now: float) -> list[Span]: ...


#: The groups running now (group id -> port); empty without the group runtime.
Runners = Callable[[], Mapping[int, Timeline]]

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SWITCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 120.0)


def pool_bubbles(runners: Mapping[int, Timeline]) -> tuple[
        dict[tuple[int, Pool], float], dict[Pool, float]]:
    """Idle fractions per (group, pool) and per pool (node-seconds over every group),
    each over ``[its first phase's start, now]`` on the group's current nodes; the
    phases in flight count as busy until now."""
    per_group: dict[tuple[int, Pool], float] = {}
    busy: dict[Pool, float] = {}
    held: dict[Pool, float] = {}
    for gid, runner in list(runners.items()):
        now, layout = runner.clock.now(), runner.layout
        # copies: the runtime thread appends and changes them meanwhile
        spans = list(runner.spans) + runner.in_flight(now)
        if not spans:
            continue
        start = min(s.start_s for s in spans)
        for pool, refs in ((Pool.ROLLOUT, layout.rollout), (Pool.TRAIN, layout.train)):
            nodes = [n.name for n in refs]
            if now <= start or not nodes:
                continue
            fraction = busy_fraction(spans, pool, nodes, start, now)
            per_group[(gid, pool)] = 1.0 - fraction
            busy[pool] = busy.get(pool, 0.0) + fraction * (now - start) * len(nodes)
            held[pool] = held.get(pool, 0.0) + (now - start) * len(nodes)
    return per_group, {p: 1.0 - busy[p] / held[p] for p in held if held[p] > 0}


class _StateCollector(Collector):
    """Gauges computed at each scrape from the store and the running groups."""

    def __init__(self, store: Store, runners: Runners) -> None:
        self.store, self.runners = store, runners

    def collect(self) -> Iterator[Metric]:
        counts = self.store.counts()
        jobs = GaugeMetricFamily("weave_jobs", "Jobs in weaved's store, by state.",
                                 labels=["state"])
        have = {str(state): int(n) for state, n in counts["jobs"]}
        for state in JobState:
            jobs.add_metric([state.value], have.get(state.value, 0))
        groups = GaugeMetricFamily("weave_groups", "Groups in weaved's store, by state.",
                                   labels=["state"])
        have = {str(state): int(n) for state, n in counts["groups"]}
        for gstate in GroupState:
            groups.add_metric([gstate.value], have.get(gstate.value, 0))
        yield jobs
        yield groups
        yield from self._allocations(counts["allocations"])
        yield from self._bubbles()

    @staticmethod
    def _allocations(rows: list[tuple[object, ...]]) -> Iterator[Metric]:
        allocs = GaugeMetricFamily(
            "weave_allocations", "Allocations not yet ended, by role, partition and state.",
            labels=["role", "partition", "state"])
        nodes = GaugeMetricFamily("weave_allocated_nodes",
                                  "Nodes of the held allocations, by role and partition.",
                                  labels=["role", "partition"])
        held: dict[tuple[str, str], int] = {}
        for role, partition, state, count, node_count in rows:
            if AllocState(str(state)).final:
                continue
            allocs.add_metric([str(role), str(partition), str(state)], float(str(count)))
            if state == AllocState.HELD.value:
                key = (str(role), str(partition))
                held[key] = held.get(key, 0) + int(str(node_count or 0))
        for (role, partition), n in sorted(held.items()):
            nodes.add_metric([role, partition], n)
        yield allocs
        yield nodes

    def _bubbles(self) -> Iterator[Metric]:
        per_group, per_pool = pool_bubbles(self.runners())
        pools = GaugeMetricFamily(
            "weave_pool_bubble_ratio", "Idle fraction of the pool's nodes in the running "
            "groups, since each group's runtime started.", labels=["pool"])
        for pool, ratio in sorted(per_pool.items(), key=lambda kv: kv[0].value):
            pools.add_metric([pool.value], ratio)
        groups = GaugeMetricFamily("weave_group_bubble_ratio",
                                   "Idle fraction of a running group's pool.",
                                   labels=["group", "pool"])
        for (gid, pool), ratio in sorted(per_group.items(), key=lambda kv: (kv[0][0],
                                                                            kv[0][1].value)):
            groups.add_metric([str(gid), pool.value], ratio)
        yield pools
        yield groups


class RuntimeMetrics:
    """The runtime's timeline observer: phase switches and segment copies."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.switch = Histogram("weave_phase_switch_seconds", "On a node, one member's "
                                "phase ending to the next member's start (it was waiting).",
                                ["phase"], registry=registry, buckets=_SWITCH_BUCKETS)
        self.sync_bytes = Counter("weave_sync_bytes_total", "Bytes put on nodes by "
                                  "segment copies.", ["what"], registry=registry)
        self.sync_seconds = Counter("weave_sync_seconds_total", "Time segment copies took.",
                                    ["what"], registry=registry)
        self.syncs = Counter("weave_syncs_total", "Segment copies.", ["what"],
                             registry=registry)
        self._last: dict[tuple[Pool, str], Span] = {}   # the last phase ended per node
        self._lock = threading.Lock()

    def phase_ended(self, span: Span) -> None:
        key = (span.pool, span.node)
        with self._lock:
            prev = self._last.get(key)
            if prev is not None and span.start_s < prev.start_s:
                return     # ended after a later one (a migrated tail): no switch to it
            self._last[key] = span
        gap = None if prev is None else switch_gap_s(prev, span)
        if gap is not None and gap >= 0:   # < 0: it overlapped a migrated tail
            self.switch.labels(span.kind.value).observe(gap)

    def synced(self, span: Span, what: str, nbytes: int) -> None:
        self.sync_bytes.labels(what).inc(max(nbytes, 0))
        self.sync_seconds.labels(what).inc(max(span.duration_s, 0.0))
        self.syncs.labels(what).inc()


class WeavedMetrics:
    """One weaved's registry, its hooks and its HTTP server (:meth:`serve`)."""

    def __init__(self, store: Store, runners: Runners) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(store, runners))
        ProcessCollector(registry=self.registry)    # process_* (memory, CPU, open fds)
        self.runtime = RuntimeMetrics(self.registry)
        self.placement = Histogram("weave_placement_latency_seconds", "One placement "
                                   "decision over a tick's pending jobs.",
                                   registry=self.registry, buckets=_LATENCY_BUCKETS)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def placed(self, seconds: float) -> None:
        self.placement.observe(seconds)

    def serve(self, port: int, addr: str) -> int:
        """Listen on ``addr:port`` (0: a free port); the port it listens on."""
        try:
            self._server, self._thread = start_http_server(port, addr=addr,
                                                           registry=self.registry)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--metrics-port {port} --metrics-addr {addr}: cannot listen "
                              f"there ({exc}); give a free port and an address of this "
                              "host") from exc
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
