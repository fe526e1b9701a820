"""Re-planning running jobs, taken only when it pays once its moves are charged (pure).

Three proposals, all built with :func:`~weave_slurm.placement.admission.place_batch` and
judged by :func:`evaluate` (``moves.relabel`` -> ``moves.pauses`` -> SLO guard ->
``moves.pays``):

- :func:`replace_jobs`: take some jobs out of their groups (``depart``, which compacts
  what is left) and place them again as a batch into the rest of the cluster. Used for
  consolidation after a departure (the shrunken group's members) and for re-placing
  recent arrivals together (online placement closer to batch quality);
- :func:`replan_worst`: the members of the least efficient groups (highest cost per
  unit of busy-time work) placed again together into the rest of the cluster (the
  simulator's hourly re-plan: O(those groups) per call, whatever the cluster size);
- :func:`regroup_all`: every running job placed again from scratch, relabelled so that
  groups keeping most of their members keep their nodes.

**Horizon.** A move pays back over the time the new plan holds. A job's remaining time
is known where its work is (``remaining_s``: the simulator in consistent accounting, a
job spec with a step budget); otherwise :data:`DEFAULT_HORIZON_S` is assumed. The
horizon of a proposal is the shortest remaining time among the jobs it moves to another
group (or re-pins, if it moves none), capped at :data:`MAX_HORIZON_S`.

**SLOs.** A proposal keeps every member feasible under the admission bound (placement
guarantees it), and a job is paused only if its new period leaves the slack to absorb
the pause within its remaining time: ``period x (1 + pause / remaining) <= budget``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from weave_slurm.placement.admission import BatchResult, batch_outcomes, refusals
from weave_slurm.placement.cluster_state import ClusterState, depart
from weave_slurm.placement.group import Group, within_budget
from weave_slurm.placement.moves import (
    MoveBooks,
    books,
    pauses,
    pays,
    relabel,
)
from weave_slurm.placement.policy import Policy
from weave_slurm.placement.work import group_work_rate

#: Remaining time assumed for a job whose work is not known (seconds).
DEFAULT_HORIZON_S = 3600.0
#: Longest horizon a move's payback is counted over: plans rarely hold longer.
MAX_HORIZON_S = 24 * 3600.0
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Replan:
    """An accepted proposal: the new state, each moved job's pause, and the books."""

    state: ClusterState
    pauses: Mapping[str, float]
    books: MoveBooks

    @property
    def moved(self) -> tuple[str, ...]:
        return tuple(sorted(self.pauses))


def needs_nodes(before: ClusterState, after: ClusterState) -> list[int]:
    """The groups a job moves into (``before`` -> ``after``) that are new or hold more
    nodes after than before: what a runtime that moves jobs only onto nodes it already
    holds cannot carry out (weaved: a move never waits for an allocation)."""
    targets = {gid for job, gid in after.job_group.items()
               if before.job_group.get(job) not in (None, gid)}
    out = []
    for gid in sorted(targets):
        g, old = after.by_id[gid], before.by_id.get(gid)
        if old is None or g.rollout_held_nodes > old.rollout_held_nodes \
                or g.train_nodes > old.train_nodes:
            out.append(gid)
    return out


def waiting_moves(before: ClusterState, after: ClusterState,
                  waiting_into: Collection[int] | None = None) -> frozenset[str] | None:
    """The jobs of ``before`` -> ``after`` whose move waits, or None when one of them
    cannot wait safely.

    A move waits when its new group is new or grows (:func:`needs_nodes`; a runtime may
    name more, ``waiting_into``: e.g. groups still forming). Until the nodes come, the
    job runs on in its old group, which runs its plan as it is meanwhile and takes its
    new one once its waiting jobs are out (:func:`deferring`). A move into such a group
    waits too, for that new plan. So a group a waiting move leaves may need no node it
    does not hold in its new plan (its members may be re-pinned on them or take other
    turns, and jobs may enter it), and no group may wait, through such chains, for
    itself. Then every job can also go back where it was if its move is withdrawn.
    """
    grows = set(needs_nodes(before, after)) | set(waiting_into or ())
    moved = moved_jobs(before, after)
    waiting = {j for j, (_, dst) in moved.items() if dst in grows}
    while True:   # a move into a group that waits for its leavers waits too
        held = _sources(moved, waiting)
        more = {j for j, (_, dst) in moved.items() if dst in held} - waiting
        if not more:
            break
        waiting |= more
    for src in held:   # the groups that wait for their leavers
        leaving = {j for j, (s, _) in moved.items() if s == src}
        entering = {j for j, (_, d) in moved.items() if d == src}
        if not _kept(before.by_id[src], after.by_id.get(src), leaving, entering):
            return None
    waits_on = {src: {moved[j][1] for j in waiting if moved[j][0] == src} & held
                for src in held}
    return frozenset(waiting) if not _cyclic(waits_on) else None


def deferring(before: ClusterState, after: ClusterState,
              waiting: Collection[str]) -> set[int]:
    """The groups that run their plan as it is until their ``waiting`` movers are out."""
    return _sources(moved_jobs(before, after), waiting)


def _sources(moved: Mapping[str, tuple[int, int]], jobs: Collection[str]) -> set[int]:
    return {moved[j][0] for j in jobs}


def moved_jobs(before: ClusterState, after: ClusterState) -> dict[str, tuple[int, int]]:
    """Each job that changes group from ``before`` to ``after``: (from, to)."""
    return {j: (src, dst) for j, src in before.job_group.items()
            if (dst := after.job_group.get(j)) is not None and dst != src}


def _cyclic(edges: Mapping[int, Collection[int]]) -> bool:
    """Whether the graph has a cycle (depth-first, colouring)."""
    state: dict[int, int] = {}

    def visit(n: int) -> bool:
        state[n] = 1
        for m in edges.get(n, ()):
            if state.get(m) == 1 or (m not in state and visit(m)):
                return True
        state[n] = 2
        return False

    return any(n not in state and visit(n) for n in edges)


def waiting_refusal(before: ClusterState, after: ClusterState,
                    waiting_into: Collection[int] = ()) -> str | None:
    """Why weaved cannot carry out the moves of ``before`` -> ``after`` that wait for
    nodes, in words; None when it can: every one can wait safely (:func:`waiting_moves`)
    and the pools have those nodes free meanwhile (:func:`short_of_nodes`)."""
    waiting = waiting_moves(before, after, waiting_into)
    if waiting is None:
        return ("a group such a move leaves would need nodes it does not hold, or groups "
                "would wait for each other's moves")
    if not waiting:
        return None
    short = short_of_nodes(before, after, {*needs_nodes(before, after), *waiting_into})
    return None if short is None else \
        f"the pools lack them while its old group holds its own: {short}"


def short_of_nodes(before: ClusterState, after: ClusterState,
                   grows: Collection[int]) -> str | None:
    """What the groups in ``grows`` lack to hold their nodes of ``after`` while the groups
    of ``before`` still hold theirs (the jobs moving out run on there until they have
    moved), in words; None when the pools have them free. A move that needs the nodes
    its own old group holds could only ever be withdrawn."""
    cap = before.capacity
    need_r: float = 0.0
    need_t = 0
    for gid in grows:
        g, old = after.by_id[gid], before.by_id.get(gid)
        need_r += max(0, g.rollout_held_nodes - (old.rollout_held_nodes if old else 0))
        need_t += max(0, g.train_nodes - (old.train_nodes if old else 0))
    free_r = max(0, cap.rollout_pool_nodes - before.rollout_nodes_used)
    free_t = max(0, cap.train_pool_nodes - before.train_nodes_used)
    short = [f"{n:g} {pool} node(s) where {free:g} are free" for n, free, pool in
             ((need_r, free_r, "rollout"), (need_t, free_t, "training")) if n > free]
    return "; ".join(short) or None


def _kept(old: Group, new: Group | None, leaving: Collection[str],
          entering: Collection[str] = ()) -> bool:
    """Whether ``new`` is ``old``'s other members without the ``leaving`` jobs and with
    the ``entering`` ones, on no node ``old`` does not hold (its members may be re-pinned
    on them, or take other turns)."""
    rest = sorted([*(m.job.job_id for m in old.members if m.job.job_id not in leaving),
                   *entering])
    if new is None:
        return not rest
    return rest == sorted(new.job_ids) and new.rollout_held_nodes <= old.rollout_held_nodes \
        and new.train_nodes <= old.train_nodes


def _remaining(job_id: str, remaining_s: Mapping[str, float] | None) -> float:
    value = None if remaining_s is None else remaining_s.get(job_id)
    return DEFAULT_HORIZON_S if value is None or not math.isfinite(value) else max(value, 0.0)


def horizon(before: ClusterState, charged: Mapping[str, float],
            remaining_s: Mapping[str, float] | None) -> float:
    """Seconds the proposal's gain is counted over (module docstring)."""
    movers = [j for j in charged if before.job_group.get(j) is not None]
    full = [j for j in movers if charged[j] > 0]
    pick = full or movers
    if not pick:
        return DEFAULT_HORIZON_S
    return min(MAX_HORIZON_S, min(_remaining(j, remaining_s) for j in pick))


def slo_allows(after: ClusterState, charged: Mapping[str, float],
               remaining_s: Mapping[str, float] | None) -> bool:
    """Every paused job can absorb its pause in its slack before it ends."""
    for job_id, pause_s in charged.items():
        g = after.by_id[after.job_group[job_id]]
        member = next(m for m in g.members if m.job.job_id == job_id)
        k, job = member.turns, member.job
        left = _remaining(job_id, remaining_s)
        if left <= 0:
            return False
        if not within_budget(g.period_s / k * (1 + pause_s / left), job.budget_s):
            return False
    return True


def evaluate(before: ClusterState, proposal: ClusterState,
             remaining_s: Mapping[str, float] | None = None,
             free: Collection[str] = (), work_before: float | None = None) -> Replan | None:
    """The proposal as a :class:`Replan` if it pays once charged, else None (``free``:
    jobs admitted but not started, moved at no charge)."""
    after = relabel(before, proposal)
    charged = pauses(before, after, free)
    if not slo_allows(after, charged, remaining_s):
        return None
    b = books(before, after, charged, horizon(before, charged, remaining_s), work_before)
    return Replan(after, charged, b) if pays(b) else None


def replace_jobs(policy: Policy, state: ClusterState, job_ids: Iterable[str],
                 remaining_s: Mapping[str, float] | None = None,
                 free: Collection[str] = (), local: bool = False) -> Replan | None:
    """Take ``job_ids`` out of their groups and place them again as one batch.

    ``local``: the batch may only use the groups it came from (and new ones), the rest
    of the cluster is left out of the search (a re-plan in O(batch), not O(cluster)).
    """
    ids = [j for j in dict.fromkeys(job_ids) if j in state.job_group]
    if not ids:
        return None
    own = {state.job_group[j] for j in ids}
    if not state.capacity.colocation and any(state.by_id[g].colocated for g in own):
        return None   # the co-located baseline's groups are not re-planned
    profiles = [m.job for g in state.groups if g.group_id in own for m in g.members
                if m.job.job_id in ids]
    profiles.sort(key=lambda p: ids.index(p.job_id))
    scope = _local_view(state, own) if local else state
    rest = scope
    for job_id in ids:
        rest = depart(rest, job_id)
    outcomes = batch_outcomes(policy, rest, profiles)
    if local:
        outcomes = [_merged(state, scope, o) for o in outcomes]
    return best_paying(state, outcomes, remaining_s, free)


def _local_view(state: ClusterState, gids: Collection[int]) -> ClusterState:
    """The groups ``gids`` alone, on pools shrunk by what the other groups hold."""
    cap = state.capacity
    others = [g for g in state.groups if g.group_id not in gids]
    small = replace(cap, rollout_pool_nodes=cap.rollout_pool_nodes
                    - math.ceil(sum(g.rollout_held_nodes for g in others) - _EPS),
                    train_pool_nodes=cap.train_pool_nodes - sum(g.train_nodes for g in others))
    return ClusterState(small, tuple(g for g in state.groups if g.group_id in gids),
                        state.next_group_id)


def _merged(state: ClusterState, scope: ClusterState, outcome: BatchResult) -> BatchResult:
    """A local outcome put back among the groups it left out."""
    inside = {g.group_id for g in scope.groups}
    groups = tuple(g for g in state.groups if g.group_id not in inside) + outcome.state.groups
    merged = ClusterState(state.capacity, tuple(sorted(groups, key=lambda g: g.group_id)),
                          max(state.next_group_id, outcome.state.next_group_id))
    return BatchResult(merged, outcome.decisions)


def worst_groups(state: ClusterState, count: int) -> list[Group]:
    """The ``count`` groups with the highest cost per unit of work (most bubble; a
    co-located group's rollout on the dear training GPUs counts as such: where
    co-location is an option, co-located groups are candidates too, so a job co-located
    while nothing could take it is grouped once something can)."""
    cap = state.capacity

    def key(g: Group) -> tuple[float, int]:
        work = group_work_rate(g, cap)
        cost = cap.rate_of(g)
        return (-(cost / work) if work > 0 else -math.inf, g.group_id)

    return sorted((g for g in state.groups if not g.colocated or cap.colocation),
                  key=key)[:count]


def replan_worst(policy: Policy, state: ClusterState, groups: int,
                 remaining_s: Mapping[str, float] | None = None) -> Replan | None:
    """The members of the ``groups`` least efficient groups placed again together into
    the rest of the cluster (all groups when there are at most ``groups``)."""
    picked = worst_groups(state, groups)
    if sum(g.size for g in picked) < 2:
        return None
    return replace_jobs(policy, state, [j for g in picked for j in g.job_ids], remaining_s)


def regroup_all(policy: Policy, state: ClusterState,
                remaining_s: Mapping[str, float] | None = None) -> Replan | None:
    """Every running job placed again from scratch; taken only if it pays."""
    again = state.capacity.colocation   # weave's co-located jobs are placed again too
    jobs = [m.job for g in state.groups if again or not g.colocated for m in g.members]
    if len(jobs) < 2:
        return None
    kept = tuple(g for g in state.groups if g.colocated and not again)
    fresh = ClusterState(state.capacity, kept, state.next_group_id)
    return best_paying(state, batch_outcomes(policy, fresh, jobs), remaining_s)


def best_paying(before: ClusterState, outcomes: Iterable[BatchResult],
                remaining_s: Mapping[str, float] | None = None,
                free: Collection[str] = ()) -> Replan | None:
    """Of the outcomes that place every job and pay, the one cheapest per unit of work
    once charged (ties: the first)."""
    best: Replan | None = None
    work_before = before.work_per_hour
    for outcome in outcomes:
        if refusals(outcome):
            continue
        plan = evaluate(before, outcome.state, remaining_s, free, work_before)
        if plan is not None and (best is None or plan.books.efficiency_after
                                 < best.books.efficiency_after * (1 - 1e-9)):
            best = plan
    return best
