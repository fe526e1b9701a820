"""A stored job as the group runtime runs it: its :class:`~weave_slurm.runtime.group.MemberSpec`.

The one translation of a store row (its spec as parsed at submission, its profile and
layout, its group's plan) into what the runtime's ``Join``/``Adopt`` commands carry.
"""

from __future__ import annotations

from weave_slurm.config.job import LEGACY_ENTRY, JobSpec
from weave_slurm.daemon.job_output import hosted_paths
from weave_slurm.daemon.records import GroupRow, JobRow
from weave_slurm.runtime.group import DeclaredProfile, MemberSpec
from weave_slurm.runtime.launch_plan import plan_for


def member_spec(job: JobRow, group: GroupRow, pins: tuple[int, ...] | None = None,
                pool: tuple[int, ...] | None = None) -> MemberSpec:
    """The runtime's view of a stored job: its spec's entry, seed, iterations, options
    and its own code (workdir, python, pythonpath); ``pins``: its rollout nodes' places
    in the runner's layout (default: the plan's pins as they are). Its layout is the
    one stored with its profile at submission (:mod:`weave_slurm.model.layout`): its
    training nodes are the group's first ``layout.train.nodes`` training nodes (those
    ``driver.job_nodes`` names), its engines sit on its pins in order. A member of a
    co-located group (``GroupPlan.colocated``) has no pins: it is ``colocated``, its
    rollout on its training node. A member of a pooled group (``GroupPlan.rollout_gpus``,
    daemon/pooling.py) has the group's share on each of its pins as its ``pool`` (the
    plan's shares where ``pool`` is not given): its engines are spread over all of them
    (runtime/pool.py)."""
    spec = job.readable_spec()
    planned = next((m for m in group.plan.members if m.job_id == job.job_id), None)
    colocated = group.plan.colocated and planned is not None
    if colocated:
        pins = ()   # it rolls out on its training node (rank 0's)
    elif pins is None:
        pins = planned.rollout_pins if planned is not None else (0,)
    layout = job.profile.layout   # None: stored by a weaved before layouts (one rank)
    train = tuple(range(layout.train.nodes if layout is not None else 1))
    files = _files(job, spec)
    return MemberSpec(str(job.job_id), entry_point=spec.entry or LEGACY_ENTRY, seed=spec.seed,
                      steps=spec.iterations, options=dict(spec.options),
                      staleness=spec.staleness, uid=job.uid, workdir=spec.workdir,
                      python=spec.python, pythonpath=spec.pythonpath,
                      container=spec.slurm.container,
                      output=files[0], error=files[1],
                      rollout_pins=tuple(pins) if colocated else tuple(pins) or (0,),
                      colocated=colocated,
                      pool=None if colocated or group.plan.rollout_gpus is None
                      else pool or (group.plan.rollout_gpus,) * len(tuple(pins) or (0,)),
                      turns=planned.turns if planned is not None else 1,
                      train_nodes=train, layout=layout,
                      launch=plan_for(spec, str(job.job_id), job.uid),
                      env=tuple(sorted(spec.slurm.array_env().items())),
                      recoveries=job.recoveries,
                      declared=DeclaredProfile(job.profile.rollout_mean_s or None,
                                               job.profile.train_mean_s or None,
                                               job.profile.slo))


def _files(job: JobRow, spec: JobSpec) -> tuple[str | None, str | None]:
    """A hosted job's ``--output``/``--error`` for its workers (a cooperative job's own
    processes open theirs: ``launch_plan``)."""
    return (None, None) if spec.launch is not None else hosted_paths(job, spec.slurm)
