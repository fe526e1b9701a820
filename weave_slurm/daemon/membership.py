"""Translating between the store's groups and the placement engine's (pure over rows).

A stored plan pins members to *slots* (:mod:`~weave_slurm.daemon.allocplan`: nodes
of the group's allocations, numbered for the group's life); placement works on compact
node indices ``0..n-1``. :func:`group_model` shows placement the group's slots in order
(every live one, so a held node nobody is pinned to is an idle node it may pack into,
and every pinned one); :func:`plan_of` names placement's indices as slots again. Any
renumbering of a group's nodes is the same placement decision, so each index is given
the slot most of its members were already pinned to: a re-pin from scratch or a
compaction after a departure moves only the members placement really moved.

**Kept places.** A job whose move out of a group waits for nodes in its new group
(:func:`~weave_slurm.placement.replan.waiting_moves`) keeps its entry in its old group's
plan until it has moved in or the move is withdrawn: it runs there meanwhile, so its
pins keep its nodes held, and the group runs that plan as it is; the plan the re-plan
gave the group waits in it (``GroupPlan.then``) until no such job is left. Placement
does not see the job there (its row names the new group), and the old group is
*closed*: no arrival joins it (only jobs whose moves wait for its next plan, listed in
that plan alone) and no departure re-pins its members while the job may still come
back to its place.

**Co-located groups** (``GroupPlan.colocated``: placement's ``colocated_group``, one
member rolling out on its own training nodes) are closed too: a newcomer joining one
would move its running member's rollout off its training node, which weaved's runtime
does not do (a co-located member is never re-pinned: ``runtime/relayout.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from weave_slurm.daemon import allocplan, pooling, room
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, JobRow, MemberPlan
from weave_slurm.errors import ConfigError
from weave_slurm.placement import Capacity, ClusterState, Group, Member, depart, pool_shrink
from weave_slurm.placement.pooled import step_gpus, stripe_nodes
from weave_slurm.slurm.backend import DEFAULT_INSTANCE

#: Members of a group in these states count for placement (they hold warm state).
_LIVE = frozenset({"PLACED", "RUNNING", "CANCELLING"})
GroupAllocs = room.GroupAllocs


def node_slots(plan: GroupPlan, allocs: Sequence[AllocRow] = ()) -> tuple[int, ...]:
    """The slots placement sees as the group's rollout nodes, in compact order."""
    return tuple(sorted(allocplan.live_slots(allocs) | allocplan.pinned(plan)))


def plan_of(group: Group, before: GroupPlan | None = None,
            allocs: Sequence[AllocRow] = (), capacity: Capacity | None = None,
            remaining_s: Mapping[str, float] | None = None, free_gpus: int = 0,
            stripe: int | None = None) -> GroupPlan:
    """The stored plan of placement's ``group``, which was ``before`` (None: a new
    group), its node indices named as slots (see module doc). A pool's rows may be
    replaced by a smaller row where ``capacity`` is given and that pays over its
    members' ``remaining_s``, its new row beside the old or in the rollout pool's
    ``free_gpus`` (daemon/pooling.py, "A replacement of rows"); a new pool's first row
    is striped over ``stripe`` nodes (None: ``capacity``'s ``placement.pooled.stripe_nodes``;
    no capacity either: one; daemon/room.py ``stripe``)."""
    if group.pooled:   # a pool of GPU shares: every member on every node of it
        pays = None if capacity is None else pool_shrink.shrink_pays(
            group, capacity, pool_shrink.pool_horizon(group, remaining_s))
        return pooling.pooled_plan(
            [(int(m.job.job_id), m.turns) for m in group.members], group.train_nodes,
            group.pool_gpus, group.gpus_per_node, step_gpus([m.job for m in group.members]),
            before, allocs, pays, free_gpus,
            stripe if stripe is not None else 1 if capacity is None else stripe_nodes(capacity))
    slot = _slots_for(group, before, allocs)
    plan = GroupPlan(group.rollout_nodes, group.train_nodes,
                     tuple(MemberPlan(int(m.job.job_id), tuple(slot[p] for p in m.rollout_pins),
                                      m.turns) for m in group.members),
                     colocated=group.colocated)
    return allocplan.normalized(plan, allocs)


def _slots_for(group: Group, before: GroupPlan | None,
               allocs: Sequence[AllocRow]) -> dict[int, int]:
    """Placement's node index -> slot: the slot most of its members were on; else the
    slot placement saw at that index, or another free live one; else a new slot."""
    space = node_slots(before, allocs) if before is not None else ()
    was = {m.job_id: m.rollout_pins for m in before.members} if before is not None else {}
    votes: Counter[tuple[int, int]] = Counter()
    for m in group.members:
        old = was.get(int(m.job.job_id))
        if old is not None and len(old) == len(m.rollout_pins):
            votes.update(zip(m.rollout_pins, old, strict=True))
    slot: dict[int, int] = {}
    for (node, s), _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])):
        if node not in slot and s not in slot.values():
            slot[node] = s
    retired = allocplan.retired_slots(allocs)
    free = [s for s in space if s not in slot.values() and s not in retired]
    fresh = max(len(allocplan.rollout_slots(allocs)), *(s + 1 for s in space), 0)
    for node in range(group.rollout_nodes):
        if node in slot:
            continue
        pick = space[node] if node < len(space) and space[node] in free \
            else free[0] if free else fresh
        if pick in free:
            free.remove(pick)
        else:
            fresh += 1
        slot[node] = pick
    return slot


def group_model(row: GroupRow, jobs: Mapping[int, JobRow], allocs: Sequence[AllocRow],
                capacity: Capacity) -> Group | None:
    """The placement engine's view of a stored group (None if no live member is left);
    ``allocs``: its allocation rows; ``capacity``: what its jobs are planned with (pools
    on: daemon/pooling.py) and a pool's GPUs are worth."""
    pooled = capacity.rollout_pooled
    index = {s: i for i, s in enumerate(node_slots(row.plan, allocs))}
    width = pooling.width(row.plan, allocs)
    members = tuple(Member(pooling.planned(jobs[m.job_id].plan_profile, jobs[m.job_id],
                                           pooled).with_id(str(m.job_id)),
                           (0,) if width else tuple(index[p] for p in m.rollout_pins),
                           m.turns)
                    for m in row.plan.members
                    if m.job_id in jobs and jobs[m.job_id].state.value in _LIVE
                    and jobs[m.job_id].group_id == row.group_id)
    if not members:
        return None
    if width:   # placement's pool: one node of ``width`` GPUs every member spans
        return Group(row.group_id, members, 1, row.plan.train_nodes, pool_gpus=width,
                     gpus_per_node=capacity.rollout_gpus_per_node)
    return Group(row.group_id, members, len(index), row.plan.train_nodes,
                 colocated=row.plan.colocated)


def cluster_state(capacity: Capacity, groups: Sequence[GroupRow], jobs: Sequence[JobRow],
                  next_group_id: int, allocs: GroupAllocs | None = None) -> ClusterState:
    """The ClusterState placement decides over, rebuilt from the store."""
    by_id = {j.job_id: j for j in jobs}
    rows = allocs or {}
    shown = [g for g in groups if g.state.value in ("FORMING", "ACTIVE")]
    models = [group_model(g, by_id, rows.get(g.group_id, ()), capacity) for g in shown]
    closed = frozenset(g.group_id for g in shown if kept_places(g, by_id) or g.plan.colocated)
    return ClusterState(capacity, tuple(m for m in models if m is not None), next_group_id,
                        closed)


def kept_places(row: GroupRow, jobs: Mapping[int, JobRow]) -> set[int]:
    """The jobs that keep their place in ``row``'s plan while they move out of it (their
    live row names another group; see module doc)."""
    return {m.job_id for m in row.plan.members
            if (j := jobs.get(m.job_id)) is not None and j.state.value in _LIVE
            and j.group_id != row.group_id}


def plan_writes(before: ClusterState, after: ClusterState, groups: Sequence[GroupRow],
                allocs: GroupAllocs, instance: str,
                remaining_s: Mapping[str, float] | None = None
                ) -> list[tuple[int, str, GroupPlan, bool]]:
    """The stored plans of the groups a placement batch changed: (group id, label,
    plan, is new), as :meth:`~weave_slurm.daemon.store.Store.commit_placement` takes
    (``remaining_s``: each running job's remaining seconds, where known)."""
    rows = {g.group_id: g for g in groups}
    free = pool_shrink.free_gpus(before, after)
    plans = {g.group_id: g.plan for g in groups if g.state.value in ("FORMING", "ACTIVE")}
    out: dict[int, tuple[int, str, GroupPlan, bool]] = {}
    # the groups it had first, then the new ones: a new pool stripes over the nodes
    # the others leave wholly free (daemon/room.py ``stripe``)
    for g in sorted(after.groups, key=lambda g: (g.group_id not in rows, g.group_id)):
        old = before.by_id.get(g.group_id)
        if old is not None and (old.members, old.rollout_nodes, old.train_nodes,
                                old.colocated, old.pool_gpus) \
                == (g.members, g.rollout_nodes, g.train_nodes, g.colocated, g.pool_gpus):
            continue
        row = rows.get(g.group_id)
        stripe = room.stripe(after.capacity, g.pool_gpus, plans, allocs) \
            if g.pooled and row is None else None
        plan = plan_of(g, row.plan if row is not None else None, allocs.get(g.group_id, ()),
                       after.capacity, remaining_s, free, stripe)
        plans[g.group_id] = plan
        out[g.group_id] = (g.group_id, group_label(instance, g.group_id), plan, old is None)
    return [out[g.group_id] for g in after.groups if g.group_id in out]


def free_rollout_gpus(capacity: Capacity, groups: Sequence[GroupRow], jobs: Sequence[JobRow],
                      next_group_id: int, allocs: GroupAllocs) -> int:
    """The rollout pool's GPUs no group holds, as placement counts them
    (``placement.pool_shrink.free_gpus``), from the store's rows."""
    state = cluster_state(capacity, groups, jobs, next_group_id, allocs)
    return pool_shrink.free_gpus(state, state)


def plan_without(capacity: Capacity, group: GroupRow, jobs: Sequence[JobRow],
                 next_group_id: int, job_id: int, allocs: Sequence[AllocRow] = (),
                 remaining: Callable[[ClusterState], Mapping[str, float]] | None = None,
                 free_gpus: int = 0) -> GroupPlan | None:
    """The group's plan once job ``job_id`` has left it (placement's ``depart``: the
    cyclic order re-packed, unpinned nodes dropped, the group compacted); None if no
    live member is left. A group some job keeps its place in only loses the job: the
    others stay where they are (see module doc). ``remaining``: each job's remaining
    seconds in a state, where known (a pool's horizon), and ``free_gpus``, the rollout
    pool's GPUs no group holds (:func:`plan_of`)."""
    kept = kept_places(group, {j.job_id: j for j in jobs})
    if kept:
        left = group.plan.without({job_id})
        return left if left.members else None
    state = cluster_state(capacity, [group], jobs, next_group_id, {group.group_id: allocs})
    model = state.by_id.get(group.group_id)
    after = depart(state, str(job_id)) if model and str(job_id) in model.job_ids else state
    new = after.by_id.get(group.group_id)
    if new is None:
        return None
    return plan_of(new, group.plan, allocs, capacity,
                   remaining(after) if remaining is not None else None, free_gpus)


def group_label(instance: str, group_id: int) -> str:
    """The backend's group id: ``<n>`` or ``<instance>.<n>`` (letters, digits, '.', '_')."""
    return f"{instance}.{group_id}" if instance else str(group_id)


def name_prefix(instance: str) -> str:
    """The allocation-name prefix of this daemon's allocations (``weave-g<instance>.``), for
    people (``squeue -n``): a daemon without an instance has ``weave-g``, a prefix of every
    instance's names, so ownership is never decided on it (see :func:`instance_tag`)."""
    return f"weave-g{instance}." if instance else "weave-g"


def instance_tag(instance: str) -> str:
    """The tag in this daemon's allocation comments: its ``--instance``, or ``default``.

    With the uid, the tag decides which allocations are this daemon's to adopt or
    release. ``--instance default`` is refused: it would share the unnamed daemon's tag.
    """
    if instance == DEFAULT_INSTANCE:
        raise ConfigError(f"--instance {instance!r} is the tag of a weaved started without "
                          "--instance; pick another name, or leave it out")
    return instance or DEFAULT_INSTANCE
