"""Room for jobs that wait, where weaved pools rollout (pure over the store's rows).

A pool takes the width that delivers its members' work cheapest
(``placement.pooled.efficient_width``), and on an idle partition that may be all of it:
on README's cluster the first example's pool took both rollout hosts (16 GPUs for a
job of 8). That width above the fewest its members' SLOs allow is only worth taking
from GPUs no other job needs. Two rules keep it so:

- **Narrowing to admit** (:func:`candidates`). When a placement batch leaves jobs
  waiting for room, weaved narrows pools that can give back whole nodes to the fewest
  GPUs their members' SLOs allow, most GPUs freed first, one more pool at a time, and
  places the batch again (daemon/placing.py). Where that places more jobs, the narrower
  plans are written with the placement; the group runtime re-pins the members onto the
  nodes their pool keeps at their next phase boundary and gives the others back to
  Slurm once no phase runs on them, as after a departure (daemon/pooling.py, "A width
  change"; daemon/allocplan.py, "Spare nodes"). Only what a pool gives back counts:
  Slurm shrinks an allocation by nodes, never by GPUs of a node, so a pool is narrowed
  to the width of the whole nodes it keeps (``pooling.pooled_plan``), not below.
- **A new pool on whole free nodes** (:func:`stripe`). Placement counts the rollout
  partition's free GPUs together, but Slurm grants a row the same GPUs on each of its
  nodes. A new pool's first row is striped over as many nodes as one group's rollout
  may span (``placement.pooled.stripe_nodes``); where fewer nodes are wholly free and
  its width fits on those, it is striped over them instead, so that the row can be
  granted (striped over every node, a row beside a pool that holds a whole node would
  wait for GPUs on it forever).

The simulator's ``weave-live`` does not replay the narrowing (its sites have room).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from weave_slurm.daemon import allocplan, pooling
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.placement import Capacity, ClusterState
from weave_slurm.placement.group import Group
from weave_slurm.placement.pooled import fewest_gpus, pooled_group, step_gpus, stripe_nodes

#: Each group's allocation rows (every state), by group id.
GroupAllocs = Mapping[int, Sequence[AllocRow]]
#: How many pools one placement batch narrows at most (each a placement tried again).
MOST_NARROWED = 4


def _narrowable(row: GroupRow, model: Group, jobs: Mapping[int, JobRow],
                allocs: Sequence[AllocRow]) -> bool:
    """Whether ``row``'s pool may be narrowed now: active, every member running in it
    and not moving, no next plan pending, every rollout row held and none shrinking."""
    if row.state is not GroupState.ACTIVE or row.plan.then is not None \
            or row.plan.rollout_gpus is None or not model.pooled:
        return False
    members = [jobs.get(m.job_id) for m in row.plan.members]
    if any(j is None or j.state is not JobState.RUNNING or j.moving_from is not None
           or j.group_id != row.group_id for j in members):
        return False
    rollout = [a for a in allocs if a.role == allocplan.ROLLOUT
               and a.state is not AllocState.RELEASED]
    return bool(rollout) and all(a.state is AllocState.HELD and not a.gone for a in rollout)


def narrowed(row: GroupRow, model: Group, allocs: Sequence[AllocRow],
             cap: Capacity) -> Group | None:
    """``model`` (``row``'s pool) on the width it would hold narrowed to the fewest GPUs
    its members' SLOs allow: the whole nodes of its rows it keeps; None where that
    frees nothing."""
    fewest = fewest_gpus(model.group_id, model.members, cap, 1, model.pool_gpus)
    if fewest is None:
        return None
    plan = pooling.pooled_plan([(int(m.job.job_id), m.turns) for m in model.members],
                               model.train_nodes, fewest.pool_gpus, model.gpus_per_node,
                               step_gpus([m.job for m in model.members]), row.plan, allocs)
    held = pooling.width(plan, allocs)
    if not 0 < held < model.pool_gpus:
        return None
    return pooled_group(model.group_id, model.members, held, model.gpus_per_node)


def candidates(state: ClusterState, groups: Sequence[GroupRow], jobs: Sequence[JobRow],
               allocs: GroupAllocs) -> list[Group]:
    """The pools that may be narrowed now, each on the width it would hold (module doc),
    most GPUs freed first, at most :data:`MOST_NARROWED`."""
    by_id = {j.job_id: j for j in jobs}
    found: list[tuple[int, int, Group]] = []
    for row in groups:
        model = state.by_id.get(row.group_id)
        rows = allocs.get(row.group_id, ())
        if model is None or row.group_id in state.closed \
                or not _narrowable(row, model, by_id, rows):
            continue
        narrow = narrowed(row, model, rows, state.capacity)
        if narrow is not None:
            found.append((model.pool_gpus - narrow.pool_gpus, row.group_id, narrow))
    found.sort(key=lambda f: (-f[0], f[1]))
    return [narrow for _, _, narrow in found[:MOST_NARROWED]]


def narrowings(state: ClusterState, narrower: Sequence[Group]) -> Iterator[ClusterState]:
    """``state`` with one more of the ``narrower`` pools (:func:`candidates`) in place of
    its own each time."""
    swap: dict[int, Group] = {}
    for narrow in narrower:
        swap[narrow.group_id] = narrow
        yield ClusterState(state.capacity, tuple(swap.get(g.group_id, g) for g in state.groups),
                           state.next_group_id, state.closed)


def used_nodes(plans: Mapping[int, GroupPlan], allocs: GroupAllocs) -> tuple[set[str], int]:
    """The rollout nodes groups keep under ``plans`` (group id -> its plan, as it will
    be written), by name, and how many more they hold or ask for whose names are not
    known yet (rows not granted, slots no row has yet). Rows of a group without a plan
    here (one being released) keep all their nodes."""
    named: set[str] = set()
    unnamed = 0
    for gid, rows in allocs.items():
        plan = plans.get(gid)
        slots = [s for s in allocplan.rollout_slots(rows) if s.live]
        if plan is None or plan.rollout_gpus is None:   # whole rows: every live node
            keep = {s.number for s in slots}
        else:   # a pool keeps the nodes its plan pins, and its rows' first nodes
            keep = allocplan.pinned(plan) | {s.number for s in slots if s.index == 0}
        for s in slots:
            if s.number in keep:
                if s.node is not None:
                    named.add(s.node)
                else:
                    unnamed += 1
        if plan is not None:
            unnamed += len(allocplan.pinned(plan) - {s.number for s in slots})
    for gid, plan in plans.items():   # groups with no row yet: every slot is to ask for
        if gid not in allocs:
            unnamed += plan.rollout_nodes
    return named, unnamed


def stripe(cap: Capacity, width: int, plans: Mapping[int, GroupPlan],
           allocs: GroupAllocs) -> int:
    """The nodes a new pool of ``width`` GPUs stripes its first row over (module doc):
    ``stripe_nodes``, or the rollout nodes wholly free beside ``plans`` where fewer and
    its width fits on them."""
    most = stripe_nodes(cap)
    named, unnamed = used_nodes(plans, allocs)
    free = cap.rollout_pool_nodes - len(named) - unnamed
    if 1 <= free < most and width <= free * cap.rollout_gpus_per_node:
        return free
    return most
