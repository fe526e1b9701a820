"""What ``weave-live`` replays of weaved's pools (daemon/pooling.py).

With ``--rollout pooled`` (weaved: the site's ``[limits] rollout = "pooled"``, which
needs ``[runtime] gangs = true``), ``weave-live`` places with pools as weaved does (the
``weave`` engine's pooled placement, placement/pooled_placement.py), and then holds each
pool as weaved holds it, not on the width placement asked for:

- **rows of shares**: a new pool is one allocation row of GPU shares striped over as
  many nodes as one group's rollout may span (``placement.pooled.stripe_nodes``, where
  its width allows an engine on each); a wider pool keeps its rows and asks one new
  row for what it lacks, spread over as many nodes as it spans; a narrower one
  returns whole rows, newest first, while the rest still hold its width
  (``placement.pooled.pool_rows``, the function weaved's ``pooling.pooled_plan``
  calls). A row whose share is no multiple of the
  members' GPUs per engine is left for a new one.
- **replaced rows**: as weaved, a pool that would still hold more than its width
  replaces its newest rows by one smaller row beside them where that pays
  (``placement.pool_shrink.shrink_pays``, the same call as weaved's, over the members'
  remaining time where the replay knows it: consistent accounting; else placement's
  default hour). The replaced rows stay held, idle, beside the new row for one period
  of the group as it ran and the longest re-pin pause (the time ``shrink_pays``
  charges them for): the replay books those GPU-seconds as paid, idle rollout time
  (:attr:`LivePools.overlap_gpu_s`, ``Ledger.held_longer``).
- **the group is the width it holds** (:meth:`LivePools.hold`): as weaved's placement
  reads a stored pool back (``pooling.width``), the group's ``pool_gpus`` is its rows'
  GPUs together: it is charged for them, and its rollouts run over all of them (which
  only shortens them), and the next decisions start from it.
- **re-pins** (:meth:`LivePools.recharged`): a member of a pool whose held width did
  not change is not re-pinned (weaved's plan keeps its slots), so it pays no pause;
  one whose pool took or returned a row pays a re-pin, as any member whose pool
  changes width.

Who is pooled, as far as a trace says (:func:`planned`): weaved pools only a job whose
batch does not depend on its engine count (``workloads.builtins.not_poolable``), which a
trace does not say. Every trace job is taken as width-free (the reference job's
generate with ``options.sampling = "per_prompt"``, shown bit-identical at 1-8 engines by
``bench/rollout_width.py``), as trace jobs are taken as hosted by weaved's runtime for
its co-location (sim/live.py); ``ReplayOptions.width_free = False`` takes none as such:
each is planned as one no width speeds up, so it goes to a pinned group. A job that
names no model has no width model and is never pooled either way.

Not modelled: a row Slurm cannot give at once (weaved's group waits for it; here it is
held and charged from the decision on, even past the rollout pool's nodes; a
replacement's new row is taken as free beside the rows it replaces, which other groups'
shares may hold in weaved), and a surplus row's return once no phase runs on it
(returned at the decision, but a replaced row: above).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.moves import pauses
from weave_slurm.placement.pool_shrink import free_gpus, overlap_s, pool_horizon, shrink_pays
from weave_slurm.placement.pooled import (
    ShrinkPays,
    no_width,
    pool_rows,
    shrunk_rows,
    step_gpus,
    stripe_nodes,
)


@dataclass(frozen=True)
class HeldPool:
    """A pool's allocation rows as weaved holds them: ``(nodes, GPUs of each)``, oldest
    first."""

    rows: tuple[tuple[int, int], ...] = ()

    @property
    def gpus(self) -> int:
        return sum(n * g for n, g in self.rows)


def held_pool(before: HeldPool | None, width: int, gpus_per_node: int,
              step: int, pays: ShrinkPays | None = None, free: int = 0, stripe: int = 1,
              shrink_nodes: bool = True) -> tuple[HeldPool, int]:
    """The rows a pool that held ``before`` (None: new) holds at ``width`` GPUs, whose
    members' engines take ``step`` GPUs, and the GPUs of the rows it replaced (module
    doc, "rows of shares"; ``pays``: whether a replacement of rows pays, and
    ``free``, the rollout pool's GPUs its new row may count on; a new pool striped over
    ``stripe`` nodes: ``pool_rows``'; ``shrink_nodes``: a narrower pool gives back
    single nodes of its rows first, ``placement.pooled.shrunk_rows``, as weaved does;
    False: rows only, as weaved did before)."""
    rows = tuple(r for r in (before.rows if before else ()) if r[1] % step == 0)
    if shrink_nodes:   # no wider: whole rows back, then the spare nodes of the rest
        keep, new = pool_rows(rows, width, gpus_per_node, step, stripe=stripe)
        if new is None:   # and no replacement of rows (daemon/pooling.py)
            return HeldPool(shrunk_rows(tuple(r for r, on in zip(rows, keep, strict=True)
                                              if on), width)), 0
    keep, new = pool_rows(rows, width, gpus_per_node, step, pays, free, stripe)
    kept = tuple(r for r, on in zip(rows, keep, strict=True) if on)
    whole, _ = pool_rows(rows, width, gpus_per_node, step, stripe=stripe)
    replaced = sum(n * g for (n, g), w, k in zip(rows, whole, keep, strict=True)
                   if w and not k)
    return HeldPool(kept if new is None else (*kept, new)), replaced


def planned(p: JobProfile, width_free: bool) -> JobProfile:
    """``p`` as weaved plans it with pools on: as it is where it is taken as width-free,
    else as one no width speeds up (module doc, "Who is pooled")."""
    return p if width_free else no_width(p)


class LivePools:
    """Each pooled group's rows, kept from one state of the replay to the next."""

    def __init__(self, replace_rows: bool = True, beside_only: bool = False,
                 shrink_nodes: bool = True) -> None:
        #: whether a pool may replace rows by a smaller one where that pays (module
        #: doc, "replaced rows"; False: whole rows only, as weaved did before), and
        #: whether its new row may only go beside the rows it replaces (True: the rollout
        #: pool's free GPUs not counted on)
        self.replace_rows, self.beside_only = replace_rows, beside_only
        #: whether a narrower pool gives back single nodes of its rows (``held_pool``'s
        #: ``shrink_nodes``: as weaved does; False: rows only, as weaved did before)
        self.shrink_nodes = shrink_nodes
        self.held: dict[int, HeldPool] = {}
        #: GPU-seconds of replaced rows held beside their new rows, by the last
        #: :meth:`hold` (module doc, "replaced rows"); the replay books them
        self.overlap_gpu_s = 0.0

    def hold(self, before: ClusterState, after: ClusterState,
             remaining_s: Mapping[str, float] | None = None) -> ClusterState:
        """``after`` (a decision taken on ``before``, whose pools are as held) with each
        pool it changed on the GPUs weaved holds for it (``remaining_s``: each job's
        remaining seconds where known, the horizon of a replacement of rows)."""
        groups, changed = [], False
        self.overlap_gpu_s = 0.0
        cap = after.capacity
        free = 0 if self.beside_only else free_gpus(before, after)
        for g in after.groups:
            if not g.pooled or before.by_id.get(g.group_id) is g:
                groups.append(g)
                continue
            was = self.held.get(g.group_id)
            pool, replaced = held_pool(was, g.pool_gpus, g.gpus_per_node,
                                       step_gpus([m.job for m in g.members]),
                                       shrink_pays(g, cap, pool_horizon(g, remaining_s))
                                       if self.replace_rows else None, free,
                                       stripe_nodes(cap), self.shrink_nodes)
            if replaced:
                self.overlap_gpu_s += replaced * overlap_s(g, cap, was.gpus if was else 0)
            self.held[g.group_id] = pool
            changed |= pool.gpus != g.pool_gpus
            groups.append(replace(g, pool_gpus=pool.gpus) if pool.gpus != g.pool_gpus
                          else g)
        pooled = {g.group_id for g in groups if g.pooled}
        self.held = {gid: h for gid, h in self.held.items() if gid in pooled}
        return replace(after, groups=tuple(groups)) if changed else after

    @staticmethod
    def recharged(before: ClusterState, after: ClusterState,
                  charged: Mapping[str, float]) -> dict[str, float]:
        """``charged`` with the pauses of the members who stay in a pool of ``after``
        (as held) as the held widths give them (module doc, "re-pins")."""
        stay = {j for g in after.groups if g.pooled for j in g.job_ids
                if before.job_group.get(j) == g.group_id}
        out = {j: p for j, p in charged.items() if j not in stay}
        out.update((j, p) for j, p in pauses(before, after).items() if j in stay)
        return out
