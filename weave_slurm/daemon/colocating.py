"""Co-location in weaved (pure): which jobs placement may co-locate, and where.

With the site's ``[limits] colocation = true``, weaved's placement of pending jobs may
admit a job co-located (placement/colocation.py): a group of its own with no rollout
node, whose member rolls out on its own training node (``GroupPlan.colocated``; the
runtime: ``MemberSpec.colocated``). What weaved's runtime cannot run co-located is
never placed so:

- a job whose layout has more than one training rank or rollout engine, on a site that
  starts them all (``[runtime] gangs``): one resident worker switches between the two
  roles (``runtime/lifecycle.py`` refuses such a member in one line);
- a cooperative job (``[launch]``): its own processes hold one node per role.

Such a job is placed disaggregated, as it declared; :func:`barrier` says why in words.
Since a co-located group is closed (below), a job is co-located only where that beats
any group of jobs like it (:func:`placeable`): co-locating a first arrival because it
is cheaper than a group of one would keep it alone, dearer, for life (the simulator's
replay of weaved measured 21% dearer on wild with that: docs/simulator.md).
A running member is never switched between co-located and disaggregated (a co-located
member is not re-pinned: ``runtime/relayout.py``), so the plans weaved makes for jobs
that run already (a departure's re-pack, re-plans) are made with co-location off
(:func:`running`), and a co-located group takes no newcomer (``membership``: closed).
"""

from __future__ import annotations

import dataclasses

from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon.records import JobRow
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement import Capacity
from weave_slurm.placement.colocation import closed_group_profile


def barrier(job: JobRow, site: SiteConfig) -> str | None:
    """Why weaved's runtime could not run ``job`` co-located (None: it could)."""
    if job.spec is not None and job.spec.launch is not None:
        return "a cooperative job ([launch]: its own processes hold one node per role)"
    lay = job.profile.layout
    if site.runtime.gangs and lay is not None and (lay.train.ranks > 1
                                                   or lay.rollout.engines > 1):
        return (f"its layout is {lay.words()}; a co-located member runs one training "
                "rank and one engine")
    return None


def placeable(job: JobRow, site: SiteConfig, capacity: Capacity) -> JobProfile:
    """The profile placement decides ``job`` with: co-located only where its runtime
    can run it so (:func:`barrier`) and that beats any group of jobs like it
    (``closed_group_profile``: a co-located group takes no newcomer, so a job
    co-located only because it arrived first would stay alone, dearer, for life)."""
    return closed_group_profile(job.profile.with_id(str(job.job_id)), capacity,
                                capacity.colocation and barrier(job, site) is not None)


def running(capacity: Capacity) -> Capacity:
    """The capacity the plans of running jobs are made with: no co-location (module
    doc)."""
    return dataclasses.replace(capacity, colocation=False) if capacity.colocation \
        else capacity
