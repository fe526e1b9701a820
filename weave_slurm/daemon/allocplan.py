"""Allocation planning: what a group's rollout pins name, and which allocations it needs.

Pure over the store's rows (:class:`~weave_slurm.daemon.records.AllocRow`, in
allocation key order).

**Slots.** A rollout pin in a stored plan names a *slot*: one node of one of the group's
rollout allocations. Slots are numbered over every rollout allocation row the group ever
had, in key order: the first row's nodes are slots ``0..n-1``, the next row's follow.
A slot therefore names the same node for the group's whole life. A row that ends
(released, lost, refused) retires its slots and a row asked for later gets the slots
after the last one, so nothing is renumbered when an allocation comes or goes: a running
member's pins keep naming the node its warm rollout state is on while the group scales
up, shrinks or replaces a lost allocation, across weaved restarts, and there is no
moment (no crash window) in which the plan and the rows disagree. Placement works on
compact node indices; :mod:`~weave_slurm.daemon.membership` translates.

A slot is *live* (its row is wanted, being allocated or held), *retired* (its row
ended) or *future* (after every row's slots: a row not asked for yet).

**Needs** (:func:`needs`): the plan with every member on a retired slot moved to a
future one (its node was lost; the replacement will hold it) and the future slots packed
right after the rows' (:func:`normalized`); the allocations to ask for (rollout: one row
holding the future slots; training: the nodes the plan has beyond the live rows); and the
*surplus*: live rollout rows none of whose slots is pinned any more (the group shrank,
or a newcomer left before its allocation came). The reconcile loop returns a surplus
row once the driver no longer uses its nodes.

**Shares** (:func:`row_shape`): a rollout row of a plan with ``rollout_gpus`` g below
the node's GPU count holds g GPUs of each of its nodes, not the whole node: it asks
Slurm for ``--gres=gpu:<type>:g`` and the CPUs weaved asks per whole node in proportion
(x g / the node's GPUs, at least 1), and never ``--exclusive``, so another group's share
may be placed beside it on the same node (each node daemon of a share keeps its state
apart: daemon/node_daemons.py). A share row is an allocation row like any other: its
nodes are slots, it is wanted, held and returned as above.

**Spare nodes** (:func:`spare_nodes`): Slurm shrinks a running allocation by nodes
(``scontrol update JobId=X NodeList=...``), so a pooled group gives back the nodes of a
row its narrower plan no longer pins while it keeps the others (daemon/pooling.py, "A
narrower pool"). Those nodes leave the group's runtime (:func:`kept_nodes` names only
pinned nodes of a pooled plan's rows) and, once no phase runs on them, are given back
(``AllocRow.gone``, written before Slurm is asked): their slots are retired, like those
of a row that ended, and no slot is renumbered. A row keeps its first node (Slurm's
batch host); a row with no pinned slot left is returned whole (``surplus``). A pinned
group keeps an unpinned node of a row it holds, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState
from weave_slurm.errors import ConfigError, StateError

if TYPE_CHECKING:
    from weave_slurm.runtime.group import NodeRef

ROLLOUT, TRAIN = "rollout", "train"
_LIVE = frozenset({AllocState.WANTED, AllocState.ALLOCATING, AllocState.HELD})


@dataclass(frozen=True)
class Slot:
    """Slot ``number``: node ``index`` of allocation row ``row``."""

    number: int
    row: AllocRow
    index: int

    @property
    def gone(self) -> bool:
        """Its node was given back while its row is held (module doc, "Spare nodes")."""
        return self.index < len(self.row.nodes) and self.row.nodes[self.index] in self.row.gone

    @property
    def live(self) -> bool:
        return self.row.state in _LIVE and not self.gone

    @property
    def node(self) -> str | None:
        """The node it names, once its row is held (None: given back)."""
        if self.row.state is not AllocState.HELD or self.index >= len(self.row.nodes) \
                or self.gone:
            return None
        return self.row.nodes[self.index]


def rollout_slots(allocs: Iterable[AllocRow]) -> tuple[Slot, ...]:
    """Every slot of the group's rollout rows (ended ones too), in key order."""
    rows = sorted((a for a in allocs if a.role == ROLLOUT), key=lambda a: a.key)
    out: list[Slot] = []
    for row in rows:
        out += [Slot(len(out) + i, row, i) for i in range(row.node_count)]
    return tuple(out)


def pinned(plan: GroupPlan) -> set[int]:
    """The slots some member of ``plan`` is pinned to."""
    return {p for m in plan.members for p in m.rollout_pins}


def live_slots(allocs: Iterable[AllocRow]) -> set[int]:
    return {s.number for s in rollout_slots(allocs) if s.live}


def retired_slots(allocs: Iterable[AllocRow]) -> set[int]:
    return {s.number for s in rollout_slots(allocs) if not s.live}


def held_nodes(allocs: Iterable[AllocRow]) -> dict[int, tuple[AllocRow, str]]:
    """Slot -> (its row, its node), for the slots of held rows."""
    return {s.number: (s.row, node) for s in rollout_slots(allocs)
            if (node := s.node) is not None}


def member_nodes(plan: GroupPlan, job_id: int,
                 allocs: Sequence[AllocRow]) -> list[tuple[AllocRow, str]] | None:
    """The nodes job ``job_id``'s pins name, in pin order; None while one of them is
    not held (a future slot, or the job is not in the plan)."""
    pins = next((m.rollout_pins for m in plan.members if m.job_id == job_id), None)
    held = held_nodes(allocs)
    if pins is None or any(p not in held for p in pins):
        return None
    return [held[p] for p in pins]


def kept_nodes(plan: GroupPlan, allocs: Sequence[AllocRow]) -> list[tuple[AllocRow, str]]:
    """The rollout nodes the group keeps and its runtime drives: every node of each held
    row with a pinned slot (of a pinned plan, an unpinned node of such a row too: the
    row is one allocation; of a pooled plan, only its pinned nodes: the others are
    given back, module doc "Spare nodes"), in slot order."""
    used = pinned(plan)
    slots = rollout_slots(allocs)
    keep = {s.row.key for s in slots if s.number in used}
    spare = {s.number for s in _spare(plan, allocs)}
    return [(s.row, node) for s in slots if s.row.key in keep and s.number not in spare
            and (node := s.node) is not None]


def _spare(plan: GroupPlan, allocs: Sequence[AllocRow]) -> list[Slot]:
    """The held slots of a pooled plan's rows that neither it nor the plan it takes
    next pins, in rows where one of them pins a slot (module doc, "Spare nodes")."""
    if plan.rollout_gpus is None:
        return []
    used = pinned(plan) | (pinned(plan.then) if plan.then is not None else set())
    slots = [s for s in rollout_slots(allocs) if s.live]
    rows = {s.row.key for s in slots if s.number in used}
    return [s for s in slots if s.row.key in rows and s.number not in used
            and s.node is not None and s.index > 0]


def spare_nodes(plan: GroupPlan,
                allocs: Sequence[AllocRow]) -> list[tuple[AllocRow, tuple[str, ...]]]:
    """Each held row of a pooled plan with nodes it no longer pins, and those nodes (in
    key order): what weaved gives back to Slurm once no phase runs on them (module
    doc, "Spare nodes"; never a row's first node)."""
    out: dict[int, tuple[AllocRow, list[str]]] = {}
    for s in _spare(plan, allocs):
        out.setdefault(s.row.key, (s.row, []))[1].append(s.row.nodes[s.index])
    return [(row, tuple(nodes)) for row, nodes in out.values()]


def normalized(plan: GroupPlan, allocs: Sequence[AllocRow]) -> GroupPlan:
    """``plan`` with every retired pinned slot moved to a future slot (members that
    shared it still share one) and the future slots packed from the first free number,
    in order: the next row asked for holds exactly them. Idempotent."""
    slots = rollout_slots(allocs)
    total, retired = len(slots), {s.number for s in slots if not s.live}
    used = pinned(plan)
    moving = sorted(p for p in used if p >= total) + sorted(used & retired)
    remap = {old: total + i for i, old in enumerate(moving)}
    if all(old == new for old, new in remap.items()):
        return plan
    return _remapped(plan, remap)


def _remapped(plan: GroupPlan, remap: dict[int, int]) -> GroupPlan:
    """``plan`` (and the plan it takes next) with its pins renamed by ``remap``."""
    return replace(plan, members=tuple(
        MemberPlan(m.job_id, tuple(remap.get(p, p) for p in m.rollout_pins), m.turns)
        for m in plan.members), then=None if plan.then is None else _remapped(plan.then, remap))


def surplus(plan: GroupPlan, allocs: Sequence[AllocRow]) -> list[AllocRow]:
    """Live rollout rows none of whose slots is pinned, now or in the plan it takes next
    (in key order)."""
    used = pinned(plan) | (pinned(plan.then) if plan.then is not None else set())
    rows: dict[int, tuple[AllocRow, bool]] = {}
    for s in rollout_slots(allocs):
        if s.live:
            row, hit = rows.get(s.row.key, (s.row, False))
            rows[s.row.key] = (row, hit or s.number in used)
    return [row for row, hit in rows.values() if not hit]


@dataclass(frozen=True)
class RowShape:
    """What one node of an allocation row holds: GPUs and CPUs."""

    gpus_per_node: int
    cpus_per_node: int


def row_shape(node_gpus: int, node_cpus: int, gpus: int | None = None) -> RowShape:
    """A row of ``gpus`` GPUs per node (None: the whole node) on nodes of ``node_gpus``
    GPUs for which weaved asks ``node_cpus`` CPUs whole: the CPUs in proportion, at
    least 1 (module doc, "Shares"). ConfigError where ``gpus`` is not 1..node_gpus."""
    if gpus is None or gpus == node_gpus:
        return RowShape(node_gpus, node_cpus)
    if not 1 <= gpus <= node_gpus:
        raise ConfigError(f"rollout_gpus={gpus!r}: a share holds 1 to {node_gpus} GPUs "
                          f"of a node (the pool's gpus_per_node)")
    return RowShape(gpus, max(1, node_cpus * gpus // node_gpus))


def is_share(row: AllocRow, node_gpus: int) -> bool:
    """``row`` holds fewer GPUs of its nodes than they have (``node_gpus``)."""
    return 0 < row.gpus_per_node < node_gpus


def node_key(row: AllocRow, node: str, node_gpus: int) -> str:
    """What identifies ``row``'s node daemon on ``node`` (its store, socket and its
    node in the group's runtime): the node, and for a share its Slurm job id too
    (``<node>.<job id>``): two shares of one node are two node daemons. StateError
    for a share not held yet (no job id)."""
    if not is_share(row, node_gpus):
        return node
    if row.alloc_id is None:
        raise StateError(f"{row.role} allocation {row.pool} of group {row.group_id}: not "
                         "held yet, its node daemon has no key")
    return f"{node}.{row.alloc_id}"


@dataclass(frozen=True)
class Want:
    """One allocation to ask for: ``nodes`` of ``role``; ``replaces``: for a lost one;
    ``gpus``: GPUs per node of a share (None: whole nodes)."""

    role: str
    nodes: int
    replaces: bool = False
    gpus: int | None = None


@dataclass(frozen=True)
class Needs:
    """What a group's plan needs of its allocations now (see module doc)."""

    plan: GroupPlan                 # normalized: write it before asking for anything
    wants: tuple[Want, ...]
    surplus: tuple[AllocRow, ...]


def needs(plan: GroupPlan, allocs: Sequence[AllocRow]) -> Needs:
    """The plan normalized, the allocations to ask for and the surplus rows."""
    fixed = normalized(plan, allocs)
    total = len(rollout_slots(allocs))
    lost = {p for p in pinned(plan) if p < total} & retired_slots(allocs)
    wants = []
    future = sum(p >= total for p in pinned(fixed))
    if future:
        wants.append(Want(ROLLOUT, future, replaces=bool(lost), gpus=fixed.rollout_gpus))
    train = [a for a in allocs if a.role == TRAIN]
    have = sum(a.node_count for a in train if not a.state.final)
    if have < fixed.train_nodes:
        wants.append(Want(TRAIN, fixed.train_nodes - have,
                          replaces=any(a.state is AllocState.LOST for a in train)))
    return Needs(fixed, tuple(wants), tuple(surplus(fixed, allocs)))


def lost_nodes(refs: Sequence[NodeRef], allocs: Sequence[AllocRow],
               key: Callable[[AllocRow, str], str]) -> list[NodeRef]:
    """The nodes of ``refs`` (a group runtime's layout) that no held allocation holds
    now (``key``: a node's daemon key in a row). A node whose allocation is known
    (``NodeRef.alloc_id``: on Slurm) is lost once that allocation is, even where
    another one holds the same node again: Slurm may give a node set DOWN and back to
    the allocation that replaces the lost one, whose node daemon is another (its own
    port), and the runtime must attach to that one."""
    held = {(key(a, n), a.alloc_id) for a in allocs if a.state is AllocState.HELD
            for n in a.held_nodes}
    names = {name for name, _ in held}
    return [r for r in refs if r.name not in names
            or (r.alloc_id is not None and (r.name, r.alloc_id) not in held)]
