"""Intra-group ordering: which member a free pool serves next (pure, no clock).

The cyclic round-robin of the placement engine fixes the members' order. A free pool
serves the first member, counting cyclically from the one after the member it served
last, whose next phase is ready on that pool. The schedule is *work-conserving*: a
pool never waits for a member that is not ready while another is, so a rollout that
ends before its planned (max-length) slot lets the next member start at once, and the
slack the conservative admission reserved is reclaimed.
"""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.hosted.contract import rollout_version
from weave_slurm.placement.cyclic import slot_order


def next_member(order: Sequence[str], last_served: str | None,
                ready: frozenset[str] | set[str]) -> str | None:
    """The member a free pool serves next, or None when none is ready.

    ``order`` is the cyclic order; ``last_served`` the member the pool served last
    (None: start at the head); ``ready`` the members whose next phase runs on this
    pool and may start now.
    """
    last = list(order).index(last_served) \
        if last_served is not None and last_served in order else None
    slot = next_slot(order, last, ready)
    return None if slot is None else order[slot]


def turn_slots(order: Sequence[str], turns: Sequence[int]) -> tuple[str, ...]:
    """The cyclic order of turns: member ``order[i]`` appears ``turns[i]`` times, spread
    over the cycle as placement plans it (:func:`~weave_slurm.placement.cyclic.
    slot_order`); with one turn each, ``order`` itself."""
    return tuple(order[i] for i in slot_order(turns))


def next_slot(slots: Sequence[str], last: int | None, ready: frozenset[str] | set[str],
              cycling: frozenset[str] | set[str] | None = None) -> int | None:
    """The place in ``slots`` (:func:`turn_slots`) a free pool serves next, counting
    cyclically from the place after ``last`` (the one it served last; None or out of
    range: from the head); None when it serves nobody now.

    Work-conserving (``cycling`` None): the first ready member. In turn order
    (``cycling``: the members taking part in the cycle now): the first place whose
    member is cycling, served if it is ready; otherwise the pool waits for it, as the
    plan does (members not cycling, e.g. recovering or done, are passed over).
    """
    n = len(slots)
    start = 0 if last is None or not 0 <= last < n else (last + 1) % n
    for i in range(n):
        member = slots[(start + i) % n]
        if member in ready:
            return (start + i) % n
        if cycling is not None and member in cycling:
            return None
    return None


def phase_deadline_s(declared_s: float | None, measured_s: Sequence[float],
                     factor: float, floor_s: float) -> float:
    """How long a phase may run before it is called hung.

    ``factor`` times the longest measured duration of this phase of this member, or
    the declared duration when nothing was measured yet; never below ``floor_s``
    (the first phase also pays for building the model in a fresh worker).
    """
    basis = max(measured_s) if measured_s else declared_s
    if basis is None:
        return floor_s
    return max(floor_s, factor * basis)


def rollout_ready(step: int, trained: int, staleness: int, steps: int) -> bool:
    """May the rollout of ``step`` start when ``trained`` versions exist (the window)?"""
    return step < steps and rollout_version(step, staleness) <= trained
