"""What ``weave status`` / ``weave show job`` say about a job's layout (read-only).

The layout (:mod:`weave_slurm.model.layout`) is stored with the job's profile at
submission; here it is named on the group's nodes: training node ``i`` is the group's
``i``-th held training node (those :func:`~weave_slurm.daemon.driver.job_nodes` names),
rollout node ``i`` the job's ``i``-th pin, named as the group's runtime names it (a GPU
share's node: its node daemon's key ``<host>.<job id>``, daemon/node_daemons.py).
``runs`` says what the group runtime starts
of it, where that is less than the layout (a site with ``[runtime] gangs = false``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from weave_slurm.config.job import LEGACY_ENTRY
from weave_slurm.daemon import allocplan
from weave_slurm.daemon.driver import pool_nodes
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow
from weave_slurm.model.layout import MemberLayout
from weave_slurm.workloads.builtins import pooling_words

#: What the group runtime starts of a layout larger than one rank and one engine on a
#: site with ``[runtime] gangs = false`` (it starts all of it otherwise).
RANK0_ONLY = ("the runtime starts 1 training process (on the first training node: the "
              "site's [runtime] gangs = false) and 1 rollout engine per rollout (on one "
              "pin); the layout's other ranks and engines are not started")


def layout_row(job: JobRow, group: GroupRow | None,
               allocs: Mapping[int, Sequence[AllocRow]], hosted: bool,
               gangs: bool = True, node_gpus: int = 0) -> dict[str, Any] | None:
    """The job's layout with node names where its group holds them (``allocs``: every
    row of each group, ended ones too: a pin is a slot numbered over all of them; None:
    a job stored before layouts existed). ``hosted``: weaved's group runtime runs it;
    ``gangs``: the site's ``[runtime] gangs`` (every training rank runs); ``node_gpus``:
    the rollout pool's GPUs per node (a row of fewer is a share; 0: none is)."""
    layout = job.profile.layout
    if layout is None:
        return None
    train_names: list[str | None] = [None] * layout.train.nodes
    pins: tuple[int, ...] = ()
    rollout_names: list[str | None] = [None] * layout.rollout.nodes
    if group is not None and not job.state.final:
        rows = allocs.get(group.group_id, [])
        held = [n for _, n in pool_nodes(rows, "train")][:layout.train.nodes]
        train_names[:len(held)] = held
        pins = next((m.rollout_pins for m in group.plan.members if m.job_id == job.job_id),
                    ())
        slots = allocplan.held_nodes(rows)
        rollout_names = [allocplan.node_key(*slots[p], node_gpus) if p in slots else None
                         for p in pins] or rollout_names
    return {"words": layout.words(), "train": _train(layout, train_names),
            "rollout": _rollout(layout, rollout_names, pins),
            "runs": _runs(layout, gangs) if hosted else None, "pooling": _pooling(job)}


def _pooling(job: JobRow) -> str | None:
    """Whether a pooled group may spread its rollout over any width, in words
    (``workloads.builtins.not_poolable``; None: its spec is unreadable)."""
    spec = job.spec
    if spec is None:
        return None
    return pooling_words(spec.entry or LEGACY_ENTRY, spec.options, spec.launch is not None)


def _runs(layout: MemberLayout, gangs: bool) -> str | None:
    """What of ``layout`` the runtime does not start, in words (None: all of it)."""
    if not gangs and (layout.train.ranks > 1 or layout.rollout.engines > 1):
        return RANK0_ONLY
    return None


def _span(r: range) -> list[int]:
    return [r.start, r.stop - 1]


def _train(layout: MemberLayout, names: list[str | None]) -> dict[str, Any]:
    return {"ranks": layout.train.ranks, "ranks_per_node": list(layout.train.ranks_per_node),
            "nodes": [{"node": name, "ranks": _span(layout.train.ranks_on(i))}
                      for i, name in enumerate(names)]}


def _rollout(layout: MemberLayout, names: list[str | None],
             pins: tuple[int, ...]) -> dict[str, Any]:
    lay = layout.rollout
    return {"engines": lay.engines, "engine_gpus": lay.engine_gpus,
            "engines_per_node": list(lay.engines_per_node),
            "nodes": [{"node": name, "pin": pins[i] if i < len(pins) else None,
                       "engines": _span(lay.engines_on(i))}
                      for i, name in enumerate(names[:lay.nodes])]}
