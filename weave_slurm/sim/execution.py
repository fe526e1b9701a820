"""Phase-level execution of one group: the cyclic round-robin, event by event.

Runs a group's members on :class:`weave_slurm.sim.events.Simulator`. Which member a
free node serves next is decided by the live runtime's own ordering,
:func:`weave_slurm.runtime.ordering.next_slot`: the first member pinned to the node,
counting cyclically over the members' turns from the place after the one it served last,
whose next phase is ready (work-conserving: a node never waits for a member that is not
ready while another is), except that in a group whose members take turns the training
nodes (and a pooled group's rollout pool) keep to the turn order, waiting for the next
turn's member, as planned. Member
``i``'s rollout ``k`` is ready only after its training ``k-1`` and its weight sync
(on-policy barrier), and training ``k`` consumes exactly the trajectories of rollout ``k``.

A phase that spans several nodes (a member pinned to two rollout nodes, or training on
two) is a gang. A gang a node picks joins a first-come-first-served queue, and the
node is *held*, idle, for the earliest queued gang that needs it; a gang starts once
all its nodes are held for it. So two gangs never hold nodes the other waits for, and
every queued gang starts within one cyclic turn of each of its nodes. A single-node
pick is always served as ``next_slot`` decides.

Rollouts are stochastic and long-tailed (:class:`RolloutModel`): admission planned with
the max-token bound, a drawn rollout ends earlier and the next phase starts at once
(work-conserving). With *long-tail migration* the last requests of a rollout move to a
small share of the node's GPUs once the bulk is done, so the next member's rollout starts
on the rest of the node while the tail finishes; the overlapped part of that rollout runs
on ``1 - tail_gpu_share`` of the GPUs.

Invariants, checked on every step when ``check`` is on (a violation is a StateError): a
training step consumes trajectories of the member's current weight version; a rollout
starts only with the weights of the previous training step synced; no node runs two
phases beyond its capacity (one bulk phase, plus at most one migrated tail); no node's
warm state exceeds its host memory.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from weave_slurm.errors import StateError
from weave_slurm.placement.group import Group
from weave_slurm.runtime.ordering import next_slot, turn_slots
from weave_slurm.sim.events import Simulator
from weave_slurm.vocab import Phase, Pool


@dataclass(frozen=True, slots=True)
class RolloutModel:
    """Length of a rollout phase as a fraction of its max-token bound.

    The phase fraction is ``min(1, mean_fraction * X)``, ``X`` log-normal with mean 1
    and log-sd ``sigma``; the last ``tail_time_fraction`` of a rollout's time serves the
    few longest requests (the long tail) and ``tail_gpu_share`` of a node suffices
    for them.
    """

    mean_fraction: float = 1.0
    sigma: float = 0.0
    tail_time_fraction: float = 0.35
    tail_gpu_share: float = 0.125

    def draw(self, rng: random.Random) -> float:
        if self.sigma <= 0:
            return min(1.0, self.mean_fraction)
        x = rng.lognormvariate(-self.sigma ** 2 / 2, self.sigma)
        return min(1.0, self.mean_fraction * x)


DETERMINISTIC = RolloutModel()


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    job_id: str
    phase: Phase
    nodes: tuple[int, ...]
    start_s: float
    end_s: float
    iteration: int
    released_s: float  # when the node(s) became free for the next phase


@dataclass
class ExecutionResult:
    elapsed_s: float
    iterations: dict[str, int]
    records: list[PhaseRecord] = field(default_factory=list)
    completions: dict[str, list[float]] = field(default_factory=dict)

    def steady_period_s(self, job_id: str) -> float:
        """Mean iteration time over the second half of the run."""
        done = self.completions.get(job_id, [])
        half = len(done) // 2
        if half == 0 or len(done) - half == 0:
            return math.inf
        return (done[-1] - done[half - 1]) / (len(done) - half)

    def iterations_within(self, job_id: str, duration_s: float) -> float:
        """Iterations completed in ``duration_s`` from the cold start: measured inside
        the run, extrapolated past it at the steady rate of its second half."""
        done = self.completions.get(job_id, [])
        if not done:
            return 0.0
        if duration_s <= done[-1]:
            # Linear between completions: progress carries over a membership change.
            k = bisect.bisect_right(done, duration_s)
            prev = done[k - 1] if k else 0.0
            return k + (duration_s - prev) / (done[k] - prev) if done[k] > prev else float(k)
        half = len(done) // 2
        if half == 0 or done[-1] <= done[half - 1]:
            return float(len(done))
        period = (done[-1] - done[half - 1]) / (len(done) - half)
        return len(done) + (duration_s - done[-1]) / period

    def mean_iteration_s(self, job_id: str) -> float:
        n = self.iterations[job_id]
        return self.elapsed_s / n if n else math.inf

    @property
    def meta_iterations_per_hour(self) -> float:
        total = sum(self.iterations.values()) / max(len(self.iterations), 1)
        return 3600.0 * total / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(slots=True)
class _Node:
    members: tuple[int, ...]  # the members pinned here, in cyclic order
    order: tuple[str, ...]  # their turns' job ids in cyclic order (``next_slot``'s slots)
    last: int | None = None  # the place in ``order`` it served last
    held: int | None = None  # the gang this idle node is held for
    busy: bool = False
    tails: int = 0  # migrated tails still running on this node
    tail_until_s: float = 0.0


class GroupExecution:
    """Event-level execution of a group (one instance per run)."""

    def __init__(self, group: Group, model: RolloutModel = DETERMINISTIC, *,
                 migration: bool = False, seed: int = 0, check: bool = True,
                 rollout_mem_gib: float = math.inf, train_mem_gib: float = math.inf,
                 keep_records: bool = True) -> None:
        self.group = group
        self.model = model
        self.migration = migration
        self.check = check
        self.keep = keep_records
        self.rng = random.Random(seed)
        self.sim = Simulator()
        members = group.members
        self.n = len(members)
        self.ids = [m.job.job_id for m in members]
        self.index = {job_id: i for i, job_id in enumerate(self.ids)}
        self.width = group.rollout_factors or (1.0,) * self.n   # a pool's width
        self.pins = {Pool.ROLLOUT: [m.rollout_pins for m in members],
                     Pool.TRAIN: [m.train_pins for m in members]}
        self.rnodes = [self._node(Pool.ROLLOUT, r) for r in range(group.rollout_nodes)]
        self.tnodes = [self._node(Pool.TRAIN, t) for t in range(max(group.train_nodes, 1))]
        self.gangs: dict[Pool, list[int]] = {Pool.ROLLOUT: [], Pool.TRAIN: []}  # queued, FIFO
        self.version = [0] * self.n  # weights the trainer holds
        self.synced = [0] * self.n  # weights the rollout side holds
        self.traj = [-1] * self.n  # version of the trajectories waiting for training
        self.ready = [True] * self.n  # may start the next rollout
        self.waiting_train = [False] * self.n
        self.iters = [0] * self.n
        self.done_at: list[list[float]] = [[] for _ in range(self.n)]
        self.records: list[PhaseRecord] = []
        self.stop_after: int | None = None
        if check:
            self._check_memory(rollout_mem_gib, train_mem_gib)

    def _node(self, pool: Pool, node: int) -> _Node:
        members = tuple(i for i, pins in enumerate(self.pins[pool]) if node in pins)
        slots = turn_slots(self.ids, self.group.turns)
        return _Node(members, tuple(j for j in slots if self.index[j] in members))

    def _check_memory(self, rollout_mem_gib: float, train_mem_gib: float) -> None:
        s = self.group.schedule
        for pool, used, cap in (("rollout", s.rollout_mem_gib, rollout_mem_gib),
                                ("train", s.train_mem_gib, train_mem_gib)):
            for node, gib in enumerate(used):
                if gib > cap + 1e-9:
                    raise StateError(f"group {self.group.group_id}: {pool} node {node} holds "
                                     f"{gib:.1f} GiB of warm state > host memory {cap:g} GiB")

    def run(self, until_s: float | None = None, meta_iterations: int | None = None
            ) -> ExecutionResult:
        """Run until a time or until every member finished ``meta_iterations``."""
        if self.group.colocated:
            return self._run_colocated(until_s, meta_iterations)
        self.stop_after = meta_iterations
        self._dispatch()
        while self.sim.peek() != math.inf:
            if until_s is not None and self.sim.peek() > until_s:
                break
            if self.stop_after is not None and min(self.iters) >= self.stop_after:
                break
            self.sim.step()
        elapsed = until_s if until_s is not None and self.stop_after is None else self.sim.now
        ids = [m.job.job_id for m in self.group.members]
        return ExecutionResult(elapsed, dict(zip(ids, self.iters, strict=True)), self.records,
                               dict(zip(ids, self.done_at, strict=True)))

    def _run_colocated(self, until_s: float | None, meta: int | None) -> ExecutionResult:
        job = self.group.members[0].job
        n = meta if meta is not None else int((until_s or 0.0) // job.colo_iter_s)
        return ExecutionResult(n * job.colo_iter_s, {job.job_id: n}, [],
                               {job.job_id: [(k + 1) * job.colo_iter_s for k in range(n)]})

    # ------------------------------------------------------------- scheduling

    def _dispatch(self) -> None:
        # One pass per pool suffices: a start only takes readiness and nodes away.
        self._serve(Pool.ROLLOUT)
        self._serve(Pool.TRAIN)

    def _serve(self, pool: Pool) -> None:
        """Let every free node of ``pool`` serve whom ``next_slot`` decides (training in
        turn order when members take turns, as the runtime does)."""
        nodes, all_pins = (self.rnodes if pool is Pool.ROLLOUT else self.tnodes), self.pins[pool]
        flags = self.ready if pool is Pool.ROLLOUT else self.waiting_train
        gangs = self.gangs[pool]
        # a pooled group's rollout pool keeps to the turn order too (group.py)
        ordered = pool is Pool.TRAIN or self.group.pooled
        cycling = set(self.ids) if ordered and max(self.group.turns) > 1 else None
        for n, node in enumerate(nodes):
            if node.busy or node.held is not None:
                continue
            ready = {self.ids[i] for i in node.members if flags[i]}
            slot = next_slot(node.order, node.last, ready, cycling) if ready else None
            if slot is None:
                continue
            i = self.index[node.order[slot]]
            if len(all_pins[i]) > 1:
                # Gangs queue first come, first served: this node is held for the
                # earliest waiting one that needs it (the one it picked joins the queue).
                if i not in gangs:
                    gangs.append(i)
                i = next(g for g in gangs if n in all_pins[g])
            node.held = i
            pins = all_pins[i]
            if all(nodes[p].held == i for p in pins):
                if i in gangs:
                    gangs.remove(i)
                for p in pins:
                    nodes[p].held = None
                    nodes[p].last = _next_place(nodes[p], self.ids[i])
                if pool is Pool.ROLLOUT:
                    self._start_rollout(i)
                else:
                    self._start_train(i)

    def _start_rollout(self, i: int) -> None:
        m = self.group.members[i]
        now = self.sim.now
        if self.check and self.synced[i] != self.version[i]:
            raise StateError(f"job {m.job.job_id}: rollout {self.iters[i]} would start with "
                             f"weights v{self.synced[i]} while the trainer holds "
                             f"v{self.version[i]}")
        dur = m.job.rollout_max_s * self.model.draw(self.rng) * self.width[i]
        # A rollout overlapping a migrated tail runs on the rest of the node's GPUs.
        share = 1.0 - self.model.tail_gpu_share
        overlap = max((self.rnodes[p].tail_until_s - now for p in m.rollout_pins), default=0.0)
        if overlap > 0:
            dur += min(overlap, dur) * (1 / share - 1)
        release = now + dur
        if self.migration:
            early = now + dur * (1 - self.model.tail_time_fraction)
            # Migrate only if the node's previous tail is gone by then: at most one
            # tail per node, so bulk + tail never exceed the node's GPUs.
            if all(self.rnodes[p].tail_until_s <= early for p in m.rollout_pins):
                release = early
        for p in m.rollout_pins:
            node = self.rnodes[p]
            if self.check and (node.busy or node.tails > 1):
                raise StateError(f"rollout node {p} of group {self.group.group_id} would run "
                                 f"two rollouts at once")
            node.busy = True
        self.ready[i] = False
        self.sim.schedule(release, self._release_rollout_nodes, i, now + dur, priority=0)
        self.sim.schedule(now + dur, self._end_rollout, i, now, release, priority=1)

    def _release_rollout_nodes(self, i: int, tail_end_s: float) -> None:
        now = self.sim.now
        for p in self.group.members[i].rollout_pins:
            node = self.rnodes[p]
            node.busy = False
            if tail_end_s > now:
                node.tails += 1
                node.tail_until_s = max(node.tail_until_s, tail_end_s)
        self._dispatch()

    def _end_rollout(self, i: int, start_s: float, released_s: float) -> None:
        m = self.group.members[i]
        if released_s < self.sim.now:
            for p in m.rollout_pins:
                self.rnodes[p].tails -= 1
        self.traj[i] = self.synced[i]
        self.waiting_train[i] = True
        if self.keep:
            self.records.append(PhaseRecord(m.job.job_id, Phase.ROLLOUT, m.rollout_pins,
                                            start_s, self.sim.now, self.iters[i], released_s))
        self._dispatch()

    def _start_train(self, i: int) -> None:
        m = self.group.members[i]
        if self.check and self.traj[i] != self.version[i]:
            raise StateError(f"job {m.job.job_id}: training step {self.iters[i]} would consume "
                             f"trajectories of v{self.traj[i]} with weights v{self.version[i]}")
        for p in m.train_pins:
            if self.check and self.tnodes[p].busy:
                raise StateError(f"training node {p} of group {self.group.group_id} would run "
                                 f"two training phases at once")
            self.tnodes[p].busy = True
        self.waiting_train[i] = False
        self.sim.schedule_in(m.job.train_max_s, self._end_train, i, self.sim.now)

    def _end_train(self, i: int, start_s: float) -> None:
        m = self.group.members[i]
        for p in m.train_pins:
            self.tnodes[p].busy = False
        self.version[i] += 1
        self.traj[i] = -1
        if self.keep:
            self.records.append(PhaseRecord(m.job.job_id, Phase.TRAIN, m.train_pins, start_s,
                                            self.sim.now, self.iters[i], self.sim.now))
        self.iters[i] += 1
        self.done_at[i].append(self.sim.now)
        self.sim.schedule_in(m.job.sync_s, self._synced, i)
        self._dispatch()

    def _synced(self, i: int) -> None:
        self.synced[i] = self.version[i]
        self.ready[i] = True
        self._dispatch()


def _next_place(node: _Node, job_id: str) -> int:
    """The place of ``job_id``'s next turn on ``node``, counting on from its last."""
    n = len(node.order)
    start = 0 if node.last is None else node.last + 1
    return next((start + k) % n for k in range(n) if node.order[(start + k) % n] == job_id)


def migration_speedup(group: Group, model: RolloutModel, meta_iterations: int = 50,
                      seed: int = 0) -> float:
    """Throughput with long-tail migration over throughput without (same draws)."""
    base = GroupExecution(group, model, seed=seed, keep_records=False).run(
        meta_iterations=meta_iterations)
    moved = GroupExecution(group, model, migration=True, seed=seed, keep_records=False).run(
        meta_iterations=meta_iterations)
    return moved.meta_iterations_per_hour / base.meta_iterations_per_hour


def measured_mean_iteration_s(segments: list[tuple[Group, float]], job_id: str,
                              window: int = 100,
                              cache: dict[tuple[object, ...], ExecutionResult] | None = None,
                              warm: bool = False) -> float:
    """A job's mean iteration time over the group segments it lived through.

    ``segments`` are (group, seconds) pairs. Each group runs from a cold start (all
    members ready at once, a pessimistic restart at every membership change) for
    ``window`` meta-iterations; iterations inside the window are counted, beyond it
    they continue at the rate measured over the window's second half. With ``warm``
    every segment runs at that steady rate from its start (the group's schedule carries
    over a membership change instead of restarting).
    """
    total_s = iterations = 0.0
    cache = {} if cache is None else cache
    for group, seconds in segments:
        key = (group.colocated, group.rollout_nodes, group.train_nodes,
               tuple((m.job, m.rollout_pins, m.turns) for m in group.members))
        res = cache.get(key)
        if res is None:
            res = GroupExecution(group, keep_records=False).run(meta_iterations=window)
            cache[key] = res
        total_s += seconds
        iterations += (seconds / res.steady_period_s(job_id) if warm
                       else res.iterations_within(job_id, seconds))
    return total_s / iterations if iterations else math.inf


@dataclass(frozen=True, slots=True)
class SloCheck:
    """Per-job measured mean iteration time over ``slo x solo`` (< 1 means within)."""

    worst: float
    over: int  # jobs at or above their SLO
    jobs: int


def check_slo(segments_by_job: dict[str, list[tuple[Group, float]]],
              budgets_s: dict[str, float], window: int = 100, warm: bool = True) -> SloCheck:
    """Event-level check of every job's SLO over the replay (``budgets_s``: slo x solo)."""
    cache: dict[tuple[object, ...], ExecutionResult] = {}
    worst, over = 0.0, 0
    for job_id, segs in segments_by_job.items():
        ratio = measured_mean_iteration_s(segs, job_id, window, cache, warm) / budgets_s[job_id]
        worst = max(worst, ratio)
        over += ratio >= 1.0
    return SloCheck(worst, over, len(segments_by_job))
