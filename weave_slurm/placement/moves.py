"""Which running jobs a re-plan moves, what each move costs, and whether it pays (pure).

A re-plan (consolidation after a departure, re-placing recent arrivals, a periodic
re-plan) proposes a new :class:`ClusterState` for jobs that are already running. Three
questions decide whether to take it:

1. **Who moves.** :func:`relabel` first matches the proposal's groups to the current
   ones (largest common membership first), so a group that keeps most of its members
   keeps its id and its nodes. A job then *moves* when its group id changes (its warm
   state goes to another group's nodes) and is *re-pinned* when it stays but shares its
   rollout nodes with other staying members than before (its rollout state goes to
   another node of the group; both members of a changed pair are charged; in a pooled
   group, every member when the pool's width changes: its engines start again on the
   new set of GPUs).
2. **What it costs.** :func:`pauses`: the pause of each moved job, from its warm state's
   bytes over the site's links plus a restart (:class:`~weave_slurm.model.cost.MoveCost`).
   During its pause a job makes no progress while its group's nodes stay paid.
3. **Whether it pays.** :func:`pays`: the proposal must be no more expensive per hour
   (so it can never lose where lifetimes are fixed, the reference accounting) and must
   deliver work more cheaply over the horizon once the paused jobs' lost work is
   subtracted (fixed work per job, the consistent accounting, where the cost of a run
   is its busy time divided by the pools' busy fraction). Work is priced as the
   zero-bubble bound prices it: each member's busy node-time per second at the pools'
   rates (:attr:`~weave_slurm.placement.cluster_state.ClusterState.work_per_hour`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Group
from weave_slurm.placement.work import group_work_rate, member_work_rate

_EPS = 1e-9
SECONDS_PER_HOUR = 3600.0


def changed_groups(before: ClusterState, after: ClusterState
                   ) -> tuple[tuple[Group, ...], tuple[Group, ...]]:
    """Groups of ``before`` that ``after`` does not hold unchanged, and groups of
    ``after`` that are new or changed (a proposal shares untouched group objects)."""
    kept = {id(g) for g in after.groups} & {id(g) for g in before.groups}
    return (tuple(g for g in before.groups if id(g) not in kept),
            tuple(g for g in after.groups if id(g) not in kept))


def relabel(before: ClusterState, after: ClusterState) -> ClusterState:
    """``after`` with its groups renumbered to match ``before``'s where members overlap.

    Only groups the proposal changed are matched: pairs greedily by the number of
    common members (then by ids, so the result is deterministic); a matched group takes
    the old id, the others fresh ids. Unchanged groups keep theirs.
    """
    gone, new = changed_groups(before, after)
    old_ids = {g.group_id for g in gone}
    old_of = before.job_group
    overlap: dict[tuple[int, int], int] = {}
    for g in new:
        for job_id in g.job_ids:
            old = old_of.get(job_id)
            if old in old_ids:
                overlap[(g.group_id, old)] = overlap.get((g.group_id, old), 0) + 1
    new_id: dict[int, int] = {}
    taken: set[int] = set()
    for (gid, old), _n in sorted(overlap.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][0])):
        if gid not in new_id and old not in taken:
            new_id[gid] = old
            taken.add(old)
    fresh = max([before.next_group_id, after.next_group_id,
                 *(g.group_id + 1 for g in before.groups)])
    changed = {id(g) for g in new}
    groups = []
    for g in after.groups:
        if id(g) in changed:
            if g.group_id not in new_id:
                new_id[g.group_id] = fresh
                fresh += 1
            if new_id[g.group_id] != g.group_id:
                g = replace(g, group_id=new_id[g.group_id])
        groups.append(g)
    groups.sort(key=lambda g: g.group_id)
    return ClusterState(after.capacity, tuple(groups), fresh)


def _sharers(group: Group, job_id: str, among: frozenset[str]) -> frozenset[str]:
    pins = next(set(m.rollout_pins) for m in group.members if m.job.job_id == job_id)
    return frozenset(m.job.job_id for m in group.members
                     if m.job.job_id != job_id and m.job.job_id in among
                     and pins & set(m.rollout_pins))


def pauses(before: ClusterState, after: ClusterState,
           free: Collection[str] = ()) -> dict[str, float]:
    """Pause in seconds of every running job that ``after`` moves or re-pins.

    ``after`` should be relabelled (:func:`relabel`). Jobs only in ``after`` and jobs in
    ``free`` (admitted but not started yet: their state is loaded cold wherever they
    go) are not charged.
    """
    cost = after.capacity.moves
    out: dict[str, float] = {}
    for g in changed_groups(before, after)[1]:
        old = before.by_id.get(g.group_id)
        stayers = frozenset(j for j in g.job_ids if before.job_group.get(j) == g.group_id)
        for m in g.members:
            job_id = m.job.job_id
            if job_id not in before.job_group or job_id in free:
                continue
            if job_id not in stayers:
                out[job_id] = cost.move_s(m.job.rollout_state_gib, m.job.train_state_gib)
            elif old is not None and old.colocated != g.colocated:
                # its rollout moves between its training nodes and rollout nodes: its
                # rollout state is copied, its workers restart in the new layout
                out[job_id] = cost.move_s(m.job.rollout_state_gib, 0.0)
            elif old is not None and not g.colocated and (
                    _sharers(old, job_id, stayers) != _sharers(g, job_id, stayers)
                    or old.pool_gpus != g.pool_gpus):   # a pool of another width
                out[job_id] = cost.repin_s(m.job.rollout_state_gib)
    return out


@dataclass(frozen=True, slots=True)
class MoveBooks:
    """The numbers :func:`pays` compares (per hour; lost work in currency)."""

    cost_before: float
    cost_after: float
    work_before: float
    work_after: float
    lost_work: float  # busy-time value the paused jobs do not deliver
    horizon_s: float

    @property
    def efficiency_before(self) -> float:
        return self.cost_before / self.work_before if self.work_before > 0 else float("inf")

    @property
    def efficiency_after(self) -> float:
        """Cost per unit of work over the horizon, the pauses' lost work subtracted."""
        hours = self.horizon_s / SECONDS_PER_HOUR
        delivered = self.work_after * hours - self.lost_work
        return self.cost_after * hours / delivered if delivered > 0 else float("inf")


def books(before: ClusterState, after: ClusterState, charged: Mapping[str, float],
          horizon_s: float, work_before: float | None = None) -> MoveBooks:
    """The books of a proposal, ``charged`` = job id -> pause seconds (``work_before``:
    :attr:`ClusterState.work_per_hour` of ``before``, when the caller has it)."""
    cap = after.capacity
    lost = 0.0
    for job_id, pause_s in charged.items():
        g = after.by_id[after.job_group[job_id]]
        member = next(m for m in g.members if m.job.job_id == job_id)
        lost += member_work_rate(member, g, cap) * pause_s / SECONDS_PER_HOUR
    w0 = before.work_per_hour if work_before is None else work_before
    gone, new = changed_groups(before, after)
    w1 = w0 + sum(group_work_rate(g, cap) for g in new) - sum(
        group_work_rate(g, cap) for g in gone)
    return MoveBooks(before.cost_per_hour, after.cost_per_hour, w0, w1, lost, horizon_s)


def pays(b: MoveBooks) -> bool:
    """No dearer per hour, and strictly cheaper per unit of work once charged."""
    if b.cost_after > b.cost_before * (1 + _EPS) + _EPS:
        return False
    return b.efficiency_after < b.efficiency_before * (1 - 1e-6)
