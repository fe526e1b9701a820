"""weaved's Prometheus endpoint on the local backend: scraped over HTTP and parsed as
Prometheus reads it; the runtime's hooks (phase switches, copies) and the bubbles on
their own."""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.waits import wait_for
from tests.harness.weaved import call, serving, state_of
from weave_slurm.clock import VirtualClock
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.metrics import RuntimeMetrics, pool_bubbles
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Phase, Pool

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:<port>/metrics``: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def idle_config(public: Path, **more: object) -> DaemonConfig:
    return DaemonConfig(state_dir=public / "state", tick_s=0.1, client_timeout_s=1.0,
                        node_command=("sleep", "infinity"), **more)  # type: ignore[arg-type]


@pytest.fixture
def metered(public_dir: Path) -> Iterator[Weaved]:
    with serving(idle_config(public_dir, metrics_port=0), join_s=10) as w:
        yield w


def test_off_by_default(public_dir: Path) -> None:
    with serving(idle_config(public_dir), join_s=10) as w:
        assert w.metrics is None and w.metrics_port is None


def test_scrape_counts_jobs_groups_allocations_and_placements(metered: Weaved) -> None:
    sock, port = metered.config.socket, metered.metrics_port
    assert port is not None and port > 0
    jobs = [call(sock, Op.SUBMIT, spec=job_spec_toml(f"m{i}"), source=f"m{i}.toml")["job"]
            for i in range(3)]
    wait_for(lambda: all(state_of(sock, j) == "RUNNING" for j in jobs), 30, "jobs running")
    call(sock, Op.CANCEL, jobs=[jobs[0]])
    wait_for(lambda: state_of(sock, jobs[0]) == "CANCELLED", 30, "job 1 cancelled")
    samples = scrape(port)
    rows = call(sock, Op.STATUS, all=True)["jobs"]
    by_state = Counter(r["state"] for r in rows)
    assert by_state == {"RUNNING": 2, "CANCELLED": 1}
    for state in ("PENDING", "PLACED", "RUNNING", "CANCELLED", "COMPLETED", "FAILED"):
        assert value(samples, "weave_jobs", state=state) == by_state.get(state, 0), state
    groups = {r["group"] for r in rows if r["state"] == "RUNNING"}
    assert total(samples, "weave_groups", state="ACTIVE") == len(groups) >= 1
    held = [a for a in metered.store.allocs() if a.state.value == "HELD"]
    assert total(samples, "weave_allocations", state="HELD") == len(held) >= 2
    for role in ("rollout", "train"):
        want = sum(a.node_count for a in held if a.role == role)
        assert total(samples, "weave_allocated_nodes", role=role) == want >= 1
    assert value(samples, "weave_placement_latency_seconds_count") >= 1
    assert value(samples, "weave_placement_latency_seconds_sum") > 0


def test_two_weaved_in_one_process_keep_their_own_numbers(metered: Weaved,
                                                          public_dir: Path) -> None:
    sock = metered.config.socket
    call(sock, Op.SUBMIT, spec=job_spec_toml("only-here"), source="a.toml")
    other_cfg = idle_config(public_dir / "other", metrics_port=0)
    with serving(other_cfg, join_s=10) as other:
        assert other.metrics_port not in (None, metered.metrics_port)
        wait_for(lambda: value(scrape(metered.metrics_port or 0), "weave_jobs",
                               state="RUNNING") == 1, 30, "the job running, seen there")
        assert total(scrape(other.metrics_port or 0), "weave_jobs") == 0


def test_a_port_in_use_is_one_line_naming_the_flag(public_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port} .*cannot listen"):
            Weaved(idle_config(public_dir, metrics_port=port))
    assert not (public_dir / "state" / "weaved.sock").exists()   # refused before serving
    with serving(idle_config(public_dir, metrics_port=0), join_s=10) as w:   # lock released
        assert w.metrics_port
    with pytest.raises(ConfigError, match="--metrics-port 70000: must be a TCP port"):
        Weaved(idle_config(public_dir, metrics_port=70000))


# -- the runtime's hooks -----------------------------------------------------------------

def _span(job: str, node: str, start: float, end: float, *, ready: float | None = None,
          kind: Phase = Phase.TRAIN, pool: Pool = Pool.TRAIN) -> Span:
    return Span(job, kind, node, pool, start, end, True, ready, start + 0.01, end - 0.01)


def test_phase_switch_is_the_gap_to_a_waiting_other_member() -> None:
    registry = CollectorRegistry()
    m = RuntimeMetrics(registry)
    m.phase_ended(_span("a", "n0", 0.0, 1.0))
    m.phase_ended(_span("b", "n0", 1.3, 2.0, ready=0.5))     # waited: a switch of 0.32 s
    m.phase_ended(_span("b", "n0", 2.1, 3.0, ready=2.0))     # same member: no switch
    m.phase_ended(_span("a", "n0", 5.0, 6.0, ready=4.0))     # the node sat idle: none
    m.phase_ended(_span("c", "n1", 0.0, 1.0, ready=0.0))     # first on its node: none
    got = {(s.name, s.labels.get("phase")): s.value for f in registry.collect()
           for s in f.samples if s.name.startswith("weave_phase_switch_seconds_")
           and "le" not in s.labels}
    assert got[("weave_phase_switch_seconds_count", "train")] == 1
    assert got[("weave_phase_switch_seconds_sum", "train")] == pytest.approx(0.32)


def test_copies_count_bytes_and_seconds_by_what() -> None:
    registry = CollectorRegistry()
    m = RuntimeMetrics(registry)
    sync = Span("a", Phase.SYNC, "t0", Pool.TRAIN, 1.0, 1.25)
    m.synced(sync, "weights", 4096)
    m.synced(sync, "weights", 4096)
    m.synced(sync, "trajectories", 100)
    assert registry.get_sample_value("weave_sync_bytes_total", {"what": "weights"}) == 8192
    assert registry.get_sample_value("weave_sync_seconds_total",
                                     {"what": "weights"}) == pytest.approx(0.5)
    assert registry.get_sample_value("weave_syncs_total", {"what": "trajectories"}) == 1


@dataclass
class _Runner:
    """A group's timeline as its port reads it: ended spans, and phases in flight
    (job, node, pool, start) that count as busy until now."""

    layout: GroupLayout
    clock: VirtualClock
    spans: list[Span] = field(default_factory=list)
    running: list[tuple[str, str, Pool, float]] = field(default_factory=list)

    def in_flight(self, now: float) -> list[Span]:
        return [Span(j, Phase.ROLLOUT if p is Pool.ROLLOUT else Phase.TRAIN, n, p, t, now)
                for j, n, p, t in self.running]


def test_bubbles_are_idle_node_seconds_per_group_and_pool() -> None:
    def node(name: str, pool: Pool) -> NodeRef:
        return NodeRef(name, pool, Path(f"/nonexistent/{name}.sock"))

    clock = VirtualClock(10.0)
    one = _Runner(GroupLayout((node("r0", Pool.ROLLOUT), node("r1", Pool.ROLLOUT)),
                              (node("t0", Pool.TRAIN),)), clock)
    # from 0 to 10 s: r0 busy 6 s (overlapping spans count once), r1 idle, t0 busy 5 s
    one.spans += [_span("a", "r0", 0.0, 4.0, kind=Phase.ROLLOUT, pool=Pool.ROLLOUT),
                  _span("b", "r0", 3.0, 6.0, kind=Phase.ROLLOUT, pool=Pool.ROLLOUT),
                  _span("a", "t0", 4.0, 9.0)]
    two = _Runner(GroupLayout((node("r9", Pool.ROLLOUT),), (node("t9", Pool.TRAIN),)),
                  clock)
    two.spans += [_span("c", "r9", 5.0, 7.0, kind=Phase.ROLLOUT, pool=Pool.ROLLOUT)]
    # c's rollout since 7 s is still running: busy until now, though not recorded yet
    two.running.append(("c", "r9", Pool.ROLLOUT, 7.0))
    per_group, per_pool = pool_bubbles({1: one, 2: two, 3: _Runner(one.layout, clock)})
    assert per_group[(1, Pool.ROLLOUT)] == pytest.approx(1 - 6 / 20)
    assert per_group[(1, Pool.TRAIN)] == pytest.approx(0.5)
    assert per_group[(2, Pool.ROLLOUT)] == pytest.approx(0.0)
    assert per_group[(2, Pool.TRAIN)] == pytest.approx(1.0)
    assert (3, Pool.ROLLOUT) not in per_group          # no phase yet: nothing measured
    # pools: node-seconds over both groups (group 2 since 5 s)
    assert per_pool[Pool.ROLLOUT] == pytest.approx(1 - (6 + 5) / (20 + 5))
    assert per_pool[Pool.TRAIN] == pytest.approx(1 - 5 / (10 + 5))
