"""What ``weave-live`` replays of weaved's co-location (daemon/colocating.py).

With co-location on (the site's ``[limits] colocation``, as weaved; ``--colocation``),
``weave-live`` places arriving and waiting jobs as weaved places PENDING ones, and
plans running ones as weaved does:

- **placement** of jobs not running yet (arrivals, waiting jobs, jobs a failure
  stopped: weaved requeues them) may co-locate a job, except one weaved's runtime could
  not run so (:func:`barrier`) or one whose co-location does not beat any group of jobs
  like it (:func:`placeable`); a co-located group is *closed*: no newcomer joins it
  (daemon/membership.py), so :func:`placing` shows placement every co-located group
  closed;
- **plans of running jobs** (a departure's consolidation, the periodic re-plan, a re-plan
  when measured phase times miss the plan) are made with co-location off
  (:func:`planning`, weaved's ``colocating.running``), and never take a co-located
  member: a running member is never switched between co-located and disaggregated.

The barrier, as far as a trace says: a trace job holds whole nodes, so on a site that
starts every rank of a member's layout (``[runtime] gangs``, the default) it trains as
one rank per GPU of its training nodes, more than one on any node of more than one GPU:
weaved co-locates no such job. Traces do not say whether a job is cooperative
(``[launch]``, never co-located by weaved); every trace job is taken as not.
"""

from __future__ import annotations

from dataclasses import replace

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.colocation import closed_group_profile


def barrier(p: JobProfile, gang_gpus: int | None) -> str | None:
    """Why weaved's runtime could not run ``p`` co-located (None: it could), where a
    member trains as one rank per GPU of its ``gang_gpus``-GPU training nodes (None:
    ``[runtime] gangs`` off, one process a member)."""
    if gang_gpus is None:
        return None
    ranks = max(p.colo_nodes, 1) * gang_gpus
    if ranks > 1:
        return f"{ranks} training ranks; a co-located member runs one rank and one engine"
    return None


def placeable(p: JobProfile, gang_gpus: int | None, cap: Capacity) -> JobProfile:
    """``p`` as weaved's placement decides it (``colocating.placeable``): co-located
    only where :func:`barrier` does not hold and that beats any group of jobs like it
    (``closed_group_profile``)."""
    return closed_group_profile(p, cap, barrier(p, gang_gpus) is not None)


def closed(state: ClusterState) -> frozenset[int]:
    """The co-located groups of ``state`` (no newcomer joins them)."""
    return frozenset(g.group_id for g in state.groups if g.colocated)


def placing(state: ClusterState) -> ClusterState:
    """``state`` as weaved's placement of pending jobs sees it: co-located groups
    closed."""
    shut = closed(state)
    return replace(state, closed=shut) if shut else state


def planning(state: ClusterState) -> ClusterState:
    """``state`` as weaved's plans of running jobs see it: co-location off, co-located
    groups closed (placement leaves their members where they are: ``replan``)."""
    cap = state.capacity
    if not cap.colocation:
        return state
    return replace(state, capacity=replace(cap, colocation=False), closed=closed(state))
