"""A member's share of its group's allocations (pure): GPU-seconds per pool and cost.

The rule (docs/accounting.md): over every interval, each allocation the group holds is
split **equally among the members in the group during that interval**. A member is in
its group from its placement until it ends (completed, failed or cancelled); an
allocation is held from Slurm's grant until its release (or until it is found lost).
A member's cost is its node-seconds per pool at that pool's price
(:meth:`~weave_slurm.model.cost.CostRates.price`, the one home of a price), so the
members' costs add up to the cost of the group's allocations while it had members;
what the group held with no member in it (a draining group holds its nodes until
they are released) is kept apart as *unattributed*.

:func:`split_usage` books one window ``[start_s, end_s)``; the daemon calls it with
consecutive windows (:mod:`weave_slurm.daemon.usage_meter`), and since each window is cut at
every start and end inside it, the sum over windows equals the split of the whole.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from weave_slurm.model.cost import CostRates
from weave_slurm.vocab import Pool

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Held:
    """An allocation of ``pool`` held over ``[start_s, end_s)`` (Slurm job ``alloc_id``)."""

    alloc_id: str
    pool: Pool
    node_count: int
    gpus_per_node: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class Membership:
    """Job ``job_id`` is in the group over ``[start_s, end_s)``."""

    job_id: int
    start_s: float
    end_s: float


@dataclass(slots=True)
class Share:
    """What one member (or nobody: unattributed) was charged in a window."""

    gpu_s: dict[Pool, float] = field(default_factory=lambda: {p: 0.0 for p in Pool})
    node_s: dict[Pool, float] = field(default_factory=lambda: {p: 0.0 for p in Pool})
    cost: float = 0.0
    alloc_ids: set[str] = field(default_factory=set)

    def add(self, held: Held, seconds: float, rates: CostRates) -> None:
        self.gpu_s[held.pool] += held.node_count * held.gpus_per_node * seconds
        self.node_s[held.pool] += held.node_count * seconds
        self.cost += held.node_count * seconds / SECONDS_PER_HOUR * rates.price(held.pool)
        self.alloc_ids.add(held.alloc_id)

    @property
    def empty(self) -> bool:
        return not any(self.node_s.values())


@dataclass(frozen=True, slots=True)
class Split:
    """One window's books: each member's share, and what nobody was in the group for."""

    members: dict[int, Share]
    unattributed: Share


def _cuts(start_s: float, end_s: float, times: Iterable[float]) -> list[float]:
    inside = {t for t in times if start_s < t < end_s}
    return sorted({start_s, end_s} | inside)


def split_usage(held: Sequence[Held], members: Sequence[Membership], start_s: float,
                end_s: float, rates: CostRates) -> Split:
    """Each member's share of ``held`` over ``[start_s, end_s)`` (module doc)."""
    out = Split({}, Share())
    if end_s <= start_s:
        return out
    cuts = _cuts(start_s, end_s, [t for h in held for t in (h.start_s, h.end_s)]
                 + [t for m in members for t in (m.start_s, m.end_s)])
    for a, b in itertools.pairwise(cuts):
        here = [h for h in held if h.start_s <= a and h.end_s >= b]
        if not here:
            continue
        present = sorted({m.job_id for m in members if m.start_s <= a and m.end_s >= b})
        if not present:
            for h in here:
                out.unattributed.add(h, b - a, rates)
            continue
        each = (b - a) / len(present)
        for job_id in present:
            share = out.members.setdefault(job_id, Share())
            for h in here:
                share.add(h, each, rates)
    return out
