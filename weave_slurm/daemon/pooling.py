"""Pooled groups in weaved (pure): placement's pools as allocation shares, and back.

With the site's ``[limits] rollout = "pooled"`` (its default where ``[runtime] gangs`` is
on: config/site.py ``_rollout``), weaved's placement may put a job in a
*pooled* group (placement/pooled.py): the group holds ``W`` GPUs of the rollout pool
rather than whole nodes, and each member's rollout runs, in turn order, as ``W / T``
engines over all of them (the runtime: ``MemberSpec.pool``, runtime/pool.py).

- **Shares** (``placement.pooled.shares``): weaved holds a new pool as one allocation
  row of ``n`` nodes with ``g`` GPUs of each (``GroupPlan.rollout_gpus``: a *share* of
  each node, which another group's share may sit beside; daemon/allocplan.py,
  "Shares"): ``n`` nodes as the stripe below says, and on them the fewest GPUs per
  node, a multiple of every member's GPUs per engine, that hold ``W`` together.
  ``n x g`` may exceed ``W`` by less than a node's share; the group is then priced and
  planned on what it holds (:func:`width`), which only shortens its rollouts. Every
  member is pinned to every node of the pool (:func:`member_pool`: its engines follow
  each node's share).
- **Stripes** (``placement.pooled.stripe_nodes``): a new pool's first row spreads over
  as many nodes as one group's rollout may span (``[limits]
  max_rollout_nodes_per_group``) and the pool has, where its width allows an engine on
  each: 6 GPUs on two nodes of 8 are 3 + 3, not 6 on one, so that a row of the same
  shape fits beside it when it widens (6 on one node left 2 GPUs there, and the row for
  16, 5 + 5, fitted nowhere).
- **A width change** (:func:`pooled_plan`): Slurm grows no allocation, and a pool's
  members keep warm state on every share it holds. A wider pool keeps its shares and
  asks one new row for what it lacks, spread over as many nodes as it spans already
  (beside its own shares, where free GPUs are likeliest); the new row may land on a
  host the group holds a share of already (two nodes of the group: docs/daemon.md
  "Shares"). A row whose share is no multiple of a newcomer's GPUs per engine is left
  for a new one.
- **A narrower pool** returns whole rows, newest first, while the rest still hold its
  width (allocplan's surplus, once no phase runs on them), then gives back the nodes of
  its rows it can spare, newest rows first, each row keeping its first node
  (``placement.pooled.shrunk_rows``): its members are pinned to the nodes it keeps,
  re-pin at their next phase boundary, and the spare nodes are given back to Slurm
  (``scontrol update JobId=X NodeList=...``) once no phase runs on them (allocplan's
  "Spare nodes"). A narrower pool is not offered a replacement of rows (next): with
  the shrink it costs more than it saves (docs/simulator.md, "weaved's pools").
- **A replacement of rows** (``pooled_plan``'s ``pays``): a wider pool that would hold
  more than its width with its new row may instead replace its newest rows by one smaller new row of
  what the older rows lack, every member pinned to the kept rows and the new one only:
  the members re-pin onto it at their phase boundaries once it is held (as when a pool
  widens), and the replaced rows are surplus, given back once no phase runs on them.
  The old rows are held until the members have moved, so the new row needs GPUs free
  beside them: only where it fits beside the rows it replaces, on their nodes (no
  more nodes, and a share no larger than the GPUs each of their nodes has beside its
  own), or else, spread as a wider pool's new row, in the rollout pool's GPUs no
  group holds as placement counts them (``pool_shrink.free_gpus``: the site's rollout
  nodes less every group's rows, old and new); and only where it pays
  (``placement.pool_shrink.shrink_pays``): the GPUs it frees, over its members'
  shortest remaining time (their iterations left at their planned rate, where weaved's
  re-planner knows them: re-plans and departures; placement's default hour where it
  does not: arrivals), beat the members' re-pin pauses and the replaced rows held
  meanwhile (one period and a pause), by ``placement.moves.pays``' books.
- **Who is pooled** (:func:`planned`): only a job whose batch does not depend on
  its engine count (workloads/builtins.py ``not_poolable``, shown by ``weave show
  job``); placement sees any other job as one that no width speeds up, so it never
  pools it (``placement.pooled.widens``) and it goes to a pinned group, as declared.

The arithmetic of shares and rows (``shares``, ``pool_rows``, ``no_width``) is
placement/pooled.py's, and whether a replacement pays placement/pool_shrink.py's, so
that the simulator's ``weave-live`` (sim/live_pools.py) replays a pool's rows by the
same functions; this module names them as slots and rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.daemon import allocplan
from weave_slurm.daemon.records import AllocRow, GroupPlan, JobRow, MemberPlan
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.pooled import ShrinkPays, no_width, pool_rows, shrunk_rows
from weave_slurm.workloads.builtins import not_poolable


def why_not(job: JobRow) -> str | None:
    """Why ``job`` is never pooled (None: it may be): its rollout's batch depends on its
    engine count (workloads/builtins.py ``not_poolable``)."""
    spec = job.spec
    if spec is None:
        return "its spec was stored by an older weaved (no entry to judge it by)"
    return not_poolable(spec.entry or "", spec.options, cooperative=spec.launch is not None)


def planned(profile: JobProfile, job: JobRow, pooled: bool) -> JobProfile:
    """``job``'s ``profile`` as placement plans with it where pools are on (``pooled``):
    a job that may not be pooled as one no width speeds up (its floor its whole
    rollout), so placement keeps it to pinned groups (module doc)."""
    if not pooled or why_not(job) is None:
        return profile
    return no_width(profile)


def slot_gpus(plan: GroupPlan, allocs: Sequence[AllocRow] = ()) -> dict[int, int]:
    """Each pinned slot of a pooled plan and the GPUs of it the group holds: its row's
    share, or for a slot no row holds yet, the plan's ``rollout_gpus`` (the row to ask
    for next); {} where the plan is not pooled."""
    if plan.rollout_gpus is None:
        return {}
    rows = {s.number: s.row.gpus_per_node for s in allocplan.rollout_slots(allocs)}
    return {p: rows.get(p, plan.rollout_gpus) for p in sorted(allocplan.pinned(plan))}


def width(plan: GroupPlan, allocs: Sequence[AllocRow] = ()) -> int:
    """A pooled plan's GPUs (0: not pooled): its slots' shares together."""
    return sum(slot_gpus(plan, allocs).values())


def pooled_plan(members: Sequence[tuple[int, int]], train_nodes: int, pool_gpus: int,
                gpus_per_node: int, step: int, before: GroupPlan | None,
                allocs: Sequence[AllocRow], pays: ShrinkPays | None = None,
                free_gpus: int = 0, stripe: int = 1) -> GroupPlan:
    """The stored plan of a pool of ``pool_gpus`` GPUs whose ``members`` are ``(job id,
    turns)`` in cyclic order, which was ``before`` (None: new), over the group's
    allocation rows ``allocs`` (module doc, "A width change"): the shares it holds are
    kept (but rows a narrower pool does without, newest first, and rows whose share is
    no multiple of ``step``), and what it lacks is one new row of shares; or, where
    ``pays`` says a replacement pays (``placement.pool_shrink.shrink_pays``), its newest
    rows are replaced by one smaller new row, beside them or in the rollout pool's
    ``free_gpus`` (module doc, "A replacement of rows"). A pool that keeps no row
    stripes its new one over ``stripe`` nodes (``placement.pooled.stripe_nodes``)."""
    total = len(allocplan.rollout_slots(allocs))
    rows: dict[int, list[int]] = {}   # row key -> its kept slots
    gpus: dict[int, int] = {}         # row key -> GPUs of each of its nodes
    if before is not None and before.rollout_gpus is not None:
        live, was = allocplan.live_slots(allocs), allocplan.pinned(before)
        for slot in allocplan.rollout_slots(allocs):
            if slot.number in live and slot.number in was \
                    and slot.row.gpus_per_node % step == 0:
                rows.setdefault(slot.row.key, []).append(slot.number)
                gpus[slot.row.key] = slot.row.gpus_per_node
    keys = sorted(rows)   # oldest first; a narrower pool returns whole rows, newest
    shape = [(len(rows[k]), gpus[k]) for k in keys]
    keep, new = pool_rows(shape, pool_gpus, gpus_per_node, step, stripe=stripe)
    if new is None:   # no wider: whole rows back, then the spare nodes of the rest
        kept = [k for k, on in zip(keys, keep, strict=True) if on]
        counts = shrunk_rows(tuple((len(rows[k]), gpus[k]) for k in kept), pool_gpus)
        slots = sorted(s for k, (n, _) in zip(kept, counts, strict=True)
                       for s in sorted(rows[k])[:n])
    else:   # one new row, or a replacement of rows where that pays
        keep, new = pool_rows(shape, pool_gpus, gpus_per_node, step, pays, free_gpus,
                              stripe)
        kept = [k for k, on in zip(keys, keep, strict=True) if on]
        slots = sorted(s for k in kept for s in rows[k])
    g = gpus[max(kept)] if kept else None
    if new is not None:   # what it lacks: one row of shares beside those it holds
        n, g = new
        first = max([total, *(s + 1 for s in slots)])
        slots += range(first, first + n)
    plan = GroupPlan(len(slots), train_nodes,
                     tuple(MemberPlan(j, tuple(slots), t) for j, t in members),
                     rollout_gpus=g)
    return allocplan.normalized(plan, allocs)


def member_pool(plan: GroupPlan, job_id: int,
                allocs: Sequence[AllocRow]) -> tuple[int, ...] | None:
    """A pooled member's pool: its pins' shares of GPUs, in pin order (None: not
    pooled); what it joins with and weaved's re-pin carries (daemon/group_runtime.py)."""
    gpus = slot_gpus(plan, allocs)
    pins = next((m.rollout_pins for m in plan.members if m.job_id == job_id), ())
    return tuple(gpus[p] for p in pins) if gpus else None
