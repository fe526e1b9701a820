"""The replay's books of the pools: paid and busy node-time, cost, peaks, segments.

Between two changes of the cluster state every figure grows linearly, so the replay
calls :meth:`Ledger.advance` with the state that held since the last change, then
tells the ledger which groups changed (:meth:`Ledger.swap`). Busy node-time is the
groups' schedules' busy fraction times their nodes; a member paused for a move does not
run its phases, so its share of that busy time over the pause is taken back
(:meth:`Ledger.pause`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from weave_slurm.model.cost import CostRates
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Group
from weave_slurm.sim.outcome import ReplayResult, Segment

SECONDS_PER_HOUR = 3600.0


@dataclass
class Ledger:
    """Running totals of one replay (mutable, internal to it)."""

    last_s: float
    record_segments: bool = True
    node_s: dict[str, float] = field(default_factory=lambda: {"rollout": 0.0, "train": 0.0})
    busy_s: dict[str, float] = field(default_factory=lambda: {"rollout": 0.0, "train": 0.0})
    peak: dict[str, float] = field(default_factory=lambda: {"rollout": 0, "train": 0})
    cost: float = 0.0
    reference_units: float = 0.0
    busy_nodes: list[float] = field(default_factory=lambda: [0.0, 0.0])
    series: list[tuple[float, float, int, float]] = field(default_factory=list)
    seg_start: dict[int, float] = field(default_factory=dict)

    def advance(self, state: ClusterState, now: float, rates: CostRates,
                rate_override: float | None = None) -> None:
        """Book the time since the last call at ``state``'s nodes and rate (or at
        ``rate_override`` per hour, the ``optimal`` policy's)."""
        dt = now - self.last_s
        if dt > 0:
            r, t = state.rollout_nodes_used, state.train_nodes_used
            self.node_s["rollout"] += r * dt
            self.node_s["train"] += t * dt
            if rate_override is not None:
                rate = rate_override
                self.reference_units += rate / rates.train_node_hour * dt
            else:
                rate = state.cost_per_hour
                self.reference_units += (t + r / 3) * dt
            self.cost += rate * dt / SECONDS_PER_HOUR
            self.busy_s["rollout"] += self.busy_nodes[0] * dt
            self.busy_s["train"] += self.busy_nodes[1] * dt
        self.last_s = max(self.last_s, now)

    def held_longer(self, rollout_node_s: float, rates: CostRates) -> None:
        """Rollout node-time held beside a group's own, idle (a pool's replaced rows
        until its members have re-pinned: sim/live_pools.py)."""
        self.node_s["rollout"] += rollout_node_s
        self.reference_units += rollout_node_s / 3
        self.cost += rates.rollout_node_hour * rollout_node_s / SECONDS_PER_HOUR

    def swap(self, old: Group | None, new: Group | None, now: float) -> None:
        """Group ``old`` gives way to ``new`` (either may be None) at ``now``."""
        self._count_busy(old, -1.0)
        self._count_busy(new, 1.0)
        if new is not None:
            self.seg_start[new.group_id] = now

    def pause(self, group: Group, job_id: str, pause_s: float) -> None:
        """A member of ``group`` is paused for ``pause_s``: its phases do not run."""
        period = group.schedule.expected_period_s
        if period <= 0:
            return
        if group.colocated:   # its training nodes run both of its phases
            self.busy_s["train"] -= group.train_nodes * group.schedule.train_busy * pause_s
            return
        i = group.job_ids.index(job_id)
        member = group.members[i]
        share = member.turns * pause_s / period
        self.busy_s["rollout"] -= group.rollout_busy_node_s(i) * share
        self.busy_s["train"] -= member.job.train_mean_s * len(member.train_pins) * share

    def record(self, state: ClusterState, now: float, rate: float) -> None:
        r, t = state.rollout_nodes_used, state.train_nodes_used
        self.peak["rollout"] = max(self.peak["rollout"], r)
        self.peak["train"] = max(self.peak["train"], t)
        self.series.append((now, r, t, rate))

    def close_segments(self, state: ClusterState, now: float, gids: set[int],
                       out: list[Segment]) -> None:
        """End the segments of ``gids`` (groups of ``state``, the state ending now)."""
        if not self.record_segments:
            return
        for gid in gids:
            start = self.seg_start.pop(gid, None)
            group = state.by_id.get(gid)
            if start is not None and group is not None and now > start:
                out.append(Segment(group, start, now))

    def fill(self, res: ReplayResult) -> None:
        res.node_s, res.busy_node_s = dict(self.node_s), dict(self.busy_s)
        res.cost, res.reference_units = self.cost, self.reference_units
        res.peak_nodes, res.series = dict(self.peak), self.series

    def _count_busy(self, group: Group | None, sign: float) -> None:
        if group is not None:
            s = group.schedule
            self.busy_nodes[0] += sign * s.rollout_busy * group.rollout_held_nodes
            self.busy_nodes[1] += sign * s.train_busy * group.train_nodes
