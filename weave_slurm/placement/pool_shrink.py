"""Whether a pool's rows pay to be replaced by a smaller new row (pure).

A pool holds allocation rows of GPU shares (placement/pooled.py ``pool_rows``): a
narrower pool returns only whole rows, so a pool of one row, or one whose rows are each
needed in part, keeps GPUs its members then leave idle. It may instead replace its
newest rows by one smaller new row of what the older rows lack, every member re-pinned
onto it at its phase boundary (what weaved does when a pool widens), the old rows given
back once nobody runs on them. :func:`shrink_pays` says when that pays, by the model's
own books of a move (``placement.moves``), for the group alone:

- **before**: the group on what the rule of whole rows holds (``RowShrink.kept``);
  **after**: on what the replacement holds (``RowShrink.shrunk``), each priced by
  ``Capacity.rate_of`` and delivering ``work.group_work_rate`` (a narrower pool may
  lengthen the period: its work per hour falls with it).
- **the move**: every member is re-pinned (``MoveCost.repin_s`` of its rollout state,
  the pause ``moves.pauses`` charges a member whose pool changes width), unless the rule
  of whole rows re-pins them too (it changes the held width: ``was != kept``); the lost
  work is each pause times the member's work rate after. And the rows it replaces are
  held beside the new one until the last member has moved: at most one period of the
  group as it runs (each member re-pins at its next rollout) plus the longest pause, at
  the pool's price per GPU.
- **the horizon** (:func:`pool_horizon`): the pool's width holds until a member leaves
  at the latest, so its members' shortest remaining time where it is known (placement's
  own notion, ``replan.horizon``; ``replan.DEFAULT_HORIZON_S`` where it is not, capped
  at ``replan.MAX_HORIZON_S``).
- **pays**: ``moves.pays`` on these books, the overlap spread over the horizon: no
  dearer per hour and strictly cheaper per unit of work once the pauses' lost work is
  subtracted; and each paused member absorbs its pause in its slack before it ends
  (``replan.slo_allows``' rule). No threshold of its own: the freed GPUs must pay the
  re-pins and the overlap within the horizon.
- **where the new row goes** (``pooled.replacement``): the old rows are held while the
  members move, so the new row is asked only where it fits beside the rows it
  replaces, on their nodes, or in :func:`free_gpus`, the rollout pool's GPUs no group
  holds as placement counts them (the old rows of every changed pool still counted).
  Both are placement's view: GPUs beside a share may hold another group's share, and
  free GPUs may be spread over nodes none of which holds the new row's share; weaved
  then waits for the row while its members run on the old ones (a pending row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Group, within_budget
from weave_slurm.placement.moves import SECONDS_PER_HOUR, MoveBooks, pays
from weave_slurm.placement.pooled import RowShrink, ShrinkPays
from weave_slurm.placement.replan import DEFAULT_HORIZON_S, MAX_HORIZON_S
from weave_slurm.placement.work import group_work_rate, member_work_rate


def pool_horizon(group: Group, remaining_s: Mapping[str, float] | None = None) -> float:
    """Seconds a pool's width is counted to hold (module doc, "the horizon")."""
    left = []
    for m in group.members:
        value = None if remaining_s is None else remaining_s.get(m.job.job_id)
        left.append(DEFAULT_HORIZON_S if value is None or not math.isfinite(value)
                    else max(value, 0.0))
    return min(MAX_HORIZON_S, *left) if left else DEFAULT_HORIZON_S


def free_gpus(before: ClusterState, after: ClusterState) -> int:
    """The rollout pool's GPUs no group holds while ``after`` (a decision) is carried
    out from ``before``: the site's rollout nodes' GPUs less each group's, at the most
    of what it holds in ``before`` and what ``after`` gives it (a pool's old rows are
    held until its members have moved; a group ``after`` drops, until it drains), as
    placement counts them (``rollout_held_nodes``). What a replacement's new row may
    count on where it does not fit beside the rows it replaces (``pool_rows``)."""
    cap = after.capacity
    used = sum(max(g.rollout_held_nodes, before.by_id[g.group_id].rollout_held_nodes
                   if g.group_id in before.by_id else 0.0) for g in after.groups)
    used += sum(g.rollout_held_nodes for g in before.groups if g.group_id not in after.by_id)
    return max(0, math.floor((cap.rollout_pool_nodes - used) * cap.rollout_gpus_per_node
                             + 1e-6))


def overlap_s(group: Group, cap: Capacity, was: int) -> float:
    """Seconds the rows a replacement gives back stay held beside its new row: one
    period of ``group`` on the ``was`` GPUs it runs on (each member re-pins at its next
    rollout) and the longest re-pin pause (module doc, "the move")."""
    now = replace(group, pool_gpus=was) if was > 0 else group
    return now.schedule.expected_period_s + max(
        (cap.moves.repin_s(m.job.rollout_state_gib) for m in group.members), default=0.0)


def shrink_books(group: Group, cap: Capacity, horizon_s: float, s: RowShrink
                 ) -> tuple[MoveBooks, dict[str, float]]:
    """The books of replacing rows as ``s`` says for ``group`` (placement's group on
    its width; module doc) and each member's pause (empty: none is charged)."""
    before = replace(group, pool_gpus=s.kept)
    after = replace(group, pool_gpus=s.shrunk)
    repins = {m.job.job_id: cap.moves.repin_s(m.job.rollout_state_gib)
              for m in group.members}
    charged = repins if s.was == s.kept else {}
    lost = sum(member_work_rate(m, after, cap) * charged.get(m.job.job_id, 0.0)
               for m in after.members) / SECONDS_PER_HOUR
    gpu_hour = cap.rates.rollout_node_hour / group.gpus_per_node
    held_longer = gpu_hour * s.replaced * min(overlap_s(group, cap, s.was),
                                              horizon_s) / SECONDS_PER_HOUR   # currency
    hours = horizon_s / SECONDS_PER_HOUR
    extra = held_longer / hours if hours > 0 else math.inf
    return MoveBooks(cap.rate_of(before), cap.rate_of(after) + extra,
                     group_work_rate(before, cap), group_work_rate(after, cap), lost,
                     horizon_s), charged


def shrink_pays(group: Group, cap: Capacity, horizon_s: float) -> ShrinkPays:
    """Whether a :class:`RowShrink` of ``group`` (placement's group on its width) pays
    over ``horizon_s`` (module doc): ``pool_rows``' ``pays``."""
    def judge(s: RowShrink) -> bool:
        b, charged = shrink_books(group, cap, horizon_s, s)
        if not pays(b):
            return False
        after = replace(group, pool_gpus=s.shrunk)
        for m in after.members:
            pause = charged.get(m.job.job_id, 0.0)
            if pause and (horizon_s <= 0 or not within_budget(
                    after.period_s / m.turns * (1 + pause / horizon_s), m.job.budget_s)):
                return False
        return True
    return judge
