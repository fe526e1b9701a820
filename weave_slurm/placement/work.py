"""The busy-time value members deliver: the consistent accounting's unit of work (pure).

Work is priced as the zero-bubble bound prices it: each iteration of a job is worth its
own shape's busy node-time at the pools' rates (expected rollout x rollout nodes at the
rollout rate, training x training nodes at the training rate), wherever it runs. A
member of a disaggregated group delivers that value once per ``period / turns``; a
co-located job (docs/placement.md "Co-location") once per co-located iteration, so the
same job is worth the same per iteration in either kind of group and their costs per
unit of work compare directly.
"""

from __future__ import annotations

from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Group, Member


def member_value(member: Member, cap: Capacity) -> float:
    """Busy-time value of one meta-iteration of a member (its turns), at its own shape's
    busy node-time whatever its group's width, as the bound prices it (currency x s/h)."""
    j = member.job
    return member.turns * (j.rollout_mean_s * j.rollout_nodes * cap.rates.rollout_node_hour
                           + j.train_mean_s * j.train_nodes * cap.rates.train_node_hour)


def member_work_rate(member: Member, group: Group, cap: Capacity) -> float:
    """Busy-time value a member delivers per hour in its group (currency per hour)."""
    period = group.schedule.expected_period_s
    if period <= 0:
        return 0.0
    return member_value(member, cap) / period


def group_work_rate(group: Group, cap: Capacity) -> float:
    """Busy-time value a group's members deliver per hour."""
    return sum(member_work_rate(m, group, cap) for m in group.members)
