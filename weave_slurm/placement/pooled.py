"""Pooled groups: a rollout side of GPUs that every member's rollout spans (pure).

docs/placement.md "Pooled rollout". A pinned group holds whole rollout nodes and pins
each member to some of them, so a group whose members need 1.2 nodes of rollout per
period holds two (and leaves 40% of them idle) or stretches its period to fit one. A
pooled group holds ``pool_gpus`` GPUs of the rollout pool (on as many nodes as they
take; the other GPUs of a node may belong to other groups) and runs every member's
rollout over all of them, one member at a time in the cyclic turn order: the member's
batch is spread over ``pool_gpus / replica`` engine replicas, so its rollout takes
``job.width_factor(pool_gpus)`` of its time (:func:`weave_slurm.model.perf.width_factor`).
The group's width is a multiple of every member's replica (:func:`step_gpus`) and the
fewest GPUs that keep every member within its SLO (:func:`fewest_gpus`): feasibility
only grows with the width (every rollout gets shorter, nothing else changes), so a
bisection finds it.

Host memory: each member keeps its warm state per GPU on every GPU of the pool, so a
node of the pool holds every member's state per node (``Group.rollout_mem_used_gib``).

What weaved *holds* for a width (daemon/pooling.py, whose rules these are, and the
simulator's ``weave-live``, sim/live_pools.py, call the same functions): allocation
rows of GPU shares (:func:`shares`), kept while a narrower pool still needs them and
added to when it widens (:func:`pool_rows`), a new pool striped over as many nodes as
the site lets one group's rollout span (:func:`stripe_nodes`), or its newest rows
replaced by one smaller row beside them where that pays (``pool_rows``' ``pays``:
placement/pool_shrink.py); a job whose batch depends on its engine count is planned as
one no width speeds up (:func:`no_width`), so it is never pooled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Group, Member, period, within_budget
from weave_slurm.vocab import member_of

_EPS = 1e-9


class RolloutSharing(StrEnum):
    """How weave's groups hold their rollout side (``weave simulate --rollout``)."""

    PINNED = "pinned"   # whole nodes, each member pinned to some (what weaved runs)
    POOLED = "pooled"   # GPUs every member's rollout spans in turn (this module)

    @classmethod
    def parse(cls, value: str, flag: str = "--rollout") -> RolloutSharing:
        return member_of(cls, value, flag + " {value}: valid choices: {choices}")


def widens(job: JobProfile) -> bool:
    """Whether ``job``'s rollout gets shorter on more GPUs than its own (its floor is
    below its rollout time): a pool pays only through width, so only such jobs are
    pooled; the others go to node-pinned groups (a trace job whose model is unknown)."""
    return job.rollout_floor_fraction < 1 - 1e-9


def step_gpus(jobs: Sequence[JobProfile]) -> int:
    """The width a pool grows by: a multiple of every member's engine replica."""
    return math.lcm(*(max(1, j.rollout_replica_gpus) for j in jobs)) if jobs else 1


def pooled_group(group_id: int, members: Sequence[Member], pool_gpus: int,
                 gpus_per_node: int) -> Group:
    """The pooled group of ``members`` (in this cyclic order, with their turns) on
    ``pool_gpus`` GPUs; every member is pinned to the one pool."""
    ms = tuple(Member(m.job, (0,), m.turns) for m in members)
    return Group(group_id, ms, 1, max(m.job.train_nodes for m in ms),
                 pool_gpus=pool_gpus, gpus_per_node=gpus_per_node)


def least_gpus(members: Sequence[Member], gpus_per_node: int) -> int:
    """A lower bound on a feasible width: the rollouts of a meta-iteration, spread
    linearly, fit in the tightest budget (the floors only lengthen them)."""
    budget = min(m.turns * m.job.budget_s for m in members)
    work = sum(m.turns * m.job.rollout_max_s * m.job.base_gpus(gpus_per_node)
               for m in members)
    return max(1, math.ceil(work / budget - _EPS)) if budget > 0 else 1


class _Widths:
    """One member tuple's periods at any width, without a :class:`Group` per trial:
    for a pooled group only the period depends on the width (its host and device
    memory are per node of the pool), so a bisection needs the period alone and builds
    the group of the width it keeps."""

    def __init__(self, group_id: int, members: Sequence[Member], gpus_per_node: int):
        self.group_id, self.gpn = group_id, gpus_per_node
        self.members = tuple(Member(m.job, (0,), m.turns) for m in members)
        self.budget_s = min((m.turns * m.job.budget_s for m in self.members),
                            default=math.inf)
        self.train_nodes = max((m.job.train_nodes for m in self.members), default=0)

    def group(self, gpus: int) -> Group:
        return pooled_group(self.group_id, self.members, gpus, self.gpn)

    def period_s(self, gpus: int, expected: bool = False) -> float:
        factors = tuple(m.job.width_factor(gpus, self.gpn) for m in self.members)
        return period(self.members, expected=expected, factors=factors)

    def within_slo(self, gpus: int) -> bool:
        """``Group.feasible``'s SLO test of the group on ``gpus`` GPUs."""
        return within_budget(self.period_s(gpus), self.budget_s)

    def cost_per_work(self, gpus: int, cap: Capacity) -> float:
        """:func:`cost_per_work` of the group on ``gpus`` GPUs."""
        return cap.rates.rate(gpus / self.gpn, self.train_nodes) \
            * self.period_s(gpus, expected=True)


def fewest_gpus(group_id: int, members: Sequence[Member], cap: Capacity,
                lo: int, hi: int) -> Group | None:
    """The pooled group of ``members`` on the fewest GPUs in [``lo``, ``hi``] (multiples
    of :func:`step_gpus`) under which it is feasible; None if not even on ``hi``."""
    gpn = cap.rollout_gpus_per_node
    step = step_gpus([m.job for m in members])
    lo = max(step * math.ceil(max(lo, least_gpus(members, gpn)) / step), step)
    hi = step * (hi // step)
    if hi < lo:
        return None
    widths = _Widths(group_id, members, gpn)
    best = widths.group(hi)
    if not cap.fits(best):   # every limit, once: below ``hi`` only the SLO can fail
        return None
    a, b = lo // step, hi // step   # feasible at b; find the least such
    while a < b:
        mid = (a + b) // 2
        if widths.within_slo(mid * step):
            b = mid
        else:
            a = mid + 1
    return best if b * step == hi else widths.group(b * step)


def cost_per_work(group: Group, cap: Capacity) -> float:
    """The group's cost per hour times its expected period: for given members (their
    work per meta-iteration fixed) what a width changes of its cost per unit of work."""
    return cap.rate_of(group) * group.schedule.expected_period_s


def efficient_width(group_id: int, members: Sequence[Member], cap: Capacity,
                    lo: int, hi: int, narrow: Group | None = None) -> Group | None:
    """The pooled group of ``members`` on the width in [``lo``, ``hi``] that delivers
    their work cheapest (:func:`cost_per_work`), among the feasible ones; None if none.

    The fewest GPUs stretch the period up to the tightest SLO and leave the training
    node idle; past the width at which the training node binds, GPUs only cost. So the
    candidates are the fewest feasible width, the width at which the period stops
    falling (a bisection: the period only falls with the width) and three between them.
    ``narrow``: the fewest feasible width in [``lo``, ``hi``], where the caller found it.
    """
    if narrow is None:
        narrow = fewest_gpus(group_id, members, cap, lo, hi)
    if narrow is None:
        return None
    step = step_gpus([m.job for m in members])
    widths = _Widths(group_id, members, cap.rollout_gpus_per_node)
    a, b = narrow.pool_gpus // step, hi // step
    floor_s = widths.period_s(b * step, expected=True) * (1 + 1e-9)
    while a < b:   # the least width whose period is the widest's
        mid = (a + b) // 2
        if widths.period_s(mid * step, expected=True) <= floor_s:
            b = mid
        else:
            a = mid + 1
    first, last = narrow.pool_gpus // step, b
    chosen = min(sorted({first, last, *(first + (last - first) * k // 4 for k in (1, 2, 3))}),
                 key=lambda w: (widths.cost_per_work(w * step, cap), w))
    return narrow if chosen == first else widths.group(chosen * step)


def narrowed(group: Group, cap: Capacity) -> Group | None:
    """``group`` after a departure: on the width no wider than it holds that delivers
    the others' work cheapest (:func:`efficient_width`)."""
    return efficient_width(group.group_id, group.members, cap, 1, group.pool_gpus)


def max_pool_gpus(cap: Capacity) -> int:
    """The most GPUs one pooled group may hold (the site's rollout nodes per group)."""
    return cap.max_rollout_nodes_per_group * cap.rollout_gpus_per_node


def no_width(job: JobProfile) -> JobProfile:
    """``job`` as one no width speeds up (its floor its whole rollout): placement never
    pools it (:func:`widens`) and it goes to a pinned group."""
    return replace(job, rollout_width_s=(),
                   rollout_floor_s=max(job.rollout_max_s, job.rollout_floor_s))


def stripe_nodes(cap: Capacity) -> int:
    """The nodes a new pool's first row spreads over (where its width allows one engine
    on each): as many as one group's rollout may span and the rollout pool has.

    A pool widens by a row of equal shares on as many nodes as it spans
    (:func:`pool_rows`), since Slurm grants a row the same GPUs on each node. A first
    row packed onto the fewest nodes (6 of a node's 8 GPUs) leaves 2 GPUs beside it, and
    a wider pool's row (5 + 5 for 16) then fits on no two nodes of a two-node pool,
    although placement counted the GPUs free. Striped (3 + 3), the pool leaves room of
    its own shape on each node, and its row for 16 (5 + 5) fits beside it. What it
    costs: a copy of the weights per node of the pool at each sync, which placement's
    model does not charge (docs/placement.md "Pooled rollout")."""
    return max(1, min(cap.max_rollout_nodes_per_group, cap.rollout_pool_nodes))


def shares(width: int, gpus_per_node: int, step: int = 1, spread: int = 1) -> tuple[int, int]:
    """``(n, g)``: ``n`` nodes of ``gpus_per_node`` GPUs and the fewest GPUs of each, a
    multiple of ``step``, with ``n x g >= width`` (daemon/pooling.py, "Shares"): of the
    node counts from the fewest that hold ``width`` up to ``spread`` (where the width
    allows one step on each), the most nodes whose shares hold at most one step more
    than the fewest GPUs any of them holds (7 GPUs over up to 2 nodes: 2 x 4; 9 over up
    to 8: 5 x 2, not 8 x 2). ConfigError where ``step`` does not divide a node's GPUs."""
    if width < 1 or step < 1 or gpus_per_node % step:
        raise ConfigError(f"a pool of {width} GPUs in steps of {step} on nodes of "
                          f"{gpus_per_node} GPUs: valid: a width >= 1 and a step that "
                          f"divides {gpus_per_node}")
    least = -(-width // gpus_per_node)

    def share(n: int) -> int:
        per_node = -(-width // n)
        return -(-per_node // step) * step

    counts = range(least, max(least, min(spread, width // step)) + 1)
    fewest = min(k * share(k) for k in counts)
    n = max(k for k in counts if k * share(k) <= fewest + step)
    return n, share(n)


@dataclass(frozen=True, slots=True)
class RowShrink:
    """A pool's rows replaced by one smaller new row (:func:`pool_rows`), in GPUs: what
    it held (``was``), what the rule of whole rows would hold (``kept``), what it holds
    once the replacement is done (``shrunk``), the new row, and the held rows it gives
    back beyond the rule of whole rows (``replaced``: held beside the new row until every
    member has re-pinned onto it)."""

    was: int
    kept: int
    shrunk: int
    new_row: int
    replaced: int


#: Whether a :class:`RowShrink` pays (placement/pool_shrink.py ``shrink_pays``).
ShrinkPays = Callable[[RowShrink], bool]


def pool_rows(rows: Sequence[tuple[int, int]], width: int, gpus_per_node: int, step: int,
              pays: ShrinkPays | None = None, free_gpus: int = 0, stripe: int = 1
              ) -> tuple[tuple[bool, ...], tuple[int, int] | None]:
    """A pool of ``width`` GPUs over the allocation ``rows`` it holds (``(nodes, GPUs of
    each)``, oldest first): which rows it keeps (a narrower pool returns whole rows,
    newest first, while the rest still hold ``width``) and the one new row of
    :func:`shares` it asks for what it then lacks, spread over as many nodes as it keeps,
    or where it keeps none over ``stripe`` nodes (:func:`stripe_nodes`) (None: nothing;
    daemon/pooling.py, "A width change").

    ``pays`` (None: never): a pool that would still hold more than ``width`` may instead
    replace its newest rows by one new row of what the older ones lack (:func:`replacement`:
    where it fits beside the rows it replaces, or in ``free_gpus``, the rollout pool's
    GPUs no group holds), where that pays (``pays``); of those, the one that holds fewest
    GPUs."""
    keep, new = _whole_rows(rows, width, gpus_per_node, step, stripe)
    if pays is None:
        return keep, new
    was = sum(n * g for n, g in rows)
    kept = sum(n * g for (n, g), on in zip(rows, keep, strict=True) if on)
    held = kept + (new[0] * new[1] if new else 0)
    best: tuple[int, tuple[tuple[bool, ...], tuple[int, int]]] | None = None
    for k in range(len(rows)):   # keep the k oldest rows, replace the others
        row = replacement(rows, k, width, gpus_per_node, step, free_gpus, stripe)
        if row is None:
            continue
        gpus = sum(n * g for n, g in rows[:k]) + row[0] * row[1]
        gone = sum(n * g for (n, g), on in zip(rows[k:], keep[k:], strict=True) if on)
        if gpus < held and (best is None or gpus < best[0]) and pays(
                RowShrink(was, held, gpus, row[0] * row[1], gone)):
            best = (gpus, ((True,) * k + (False,) * (len(rows) - k), row))
    return best[1] if best is not None else (keep, new)


def replacement(rows: Sequence[tuple[int, int]], k: int, width: int, gpus_per_node: int,
                step: int, free_gpus: int = 0, stripe: int = 1) -> tuple[int, int] | None:
    """The one new row that, with the ``k`` oldest ``rows``, holds ``width``, in place
    of the newer rows; None where the ``k`` rows hold it alone or the new row fits
    nowhere the pool can count on. The old rows are given back only once every member
    has re-pinned, so the new row needs GPUs that are free while they are held: beside
    the rows it replaces, on their nodes (a row of no more nodes than they span, each
    share no larger than the GPUs each of their nodes has beside its own), the *cheap
    case*; or else, spread as a wider pool's new row is (over as many nodes as the kept
    rows span, or ``stripe`` nodes where it keeps none), within ``free_gpus``, the
    rollout pool's GPUs no group holds (0: none counted on: only the cheap case)."""
    lack = width - sum(n * g for n, g in rows[:k])
    gone = rows[k:]
    if lack <= 0 or not gone:
        return None
    nodes = sum(n for n, _ in gone)
    n, g = shares(lack, gpus_per_node, step, nodes)
    if n <= nodes and g <= gpus_per_node - max(g for _, g in gone):
        return n, g
    n, g = shares(lack, gpus_per_node, step, sum(n for n, _ in rows[:k]) or stripe)
    return (n, g) if n * g <= free_gpus else None


def _whole_rows(rows: Sequence[tuple[int, int]], width: int, gpus_per_node: int, step: int,
                stripe: int) -> tuple[tuple[bool, ...], tuple[int, int] | None]:
    """:func:`pool_rows` by whole rows alone (no replacement)."""
    keep = [True] * len(rows)
    have = sum(n * g for n, g in rows)
    for i in reversed(range(len(rows))):
        n, g = rows[i]
        if have - n * g >= width:
            have -= n * g
            keep[i] = False
    if have >= width:
        return tuple(keep), None
    spread = sum(n for (n, _), kept in zip(rows, keep, strict=True) if kept) or stripe
    return tuple(keep), shares(width - have, gpus_per_node, step, spread)


def shrunk_rows(rows: tuple[tuple[int, int], ...], width: int
                ) -> tuple[tuple[int, int], ...]:
    """``rows`` (each ``(nodes, GPUs of each)``, oldest first) holding at least ``width``
    with the nodes they can give back given back, newest rows first, each keeping at
    least one node (its first: Slurm's batch host): Slurm shrinks a running allocation
    by nodes (``scontrol update JobId=X NodeList=...``), so a row gives back whole nodes
    of its share (daemon/pooling.py, "A narrower pool")."""
    have = sum(n * g for n, g in rows)
    out = list(rows)
    for i in reversed(range(len(out))):
        n, g = out[i]
        drop = min(n - 1, max(0, have - width) // g)
        if drop:
            out[i] = (n - drop, g)
            have -= drop * g
    return tuple(out)
