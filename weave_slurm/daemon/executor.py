"""The seam between the control plane and the group runtime (the next issue).

The reconcile loop asks an :class:`Executor` which steps a placed job runs inside
its group's allocations and launches them (write-ahead, like everything else).
:class:`IdleExecutor` holds each job's nodes with an idle step per allocation the
job uses, so a placed job shows RUNNING (PHASE ``idle``) until the runtime that
drives rollout / sync / train phases replaces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow
from weave_slurm.daemon.states import AllocState
from weave_slurm.slurm.backend import StepSpec


@dataclass(frozen=True)
class JobStep:
    """One step of a job and the allocation it runs in."""

    alloc: AllocRow
    spec: StepSpec


def pool_nodes(allocs: Sequence[AllocRow], role: str) -> list[tuple[AllocRow, str]]:
    """A group's nodes of one role, in allocation order: node index -> (allocation, node)."""
    return [(a, n) for a in allocs if a.role == role and a.state is AllocState.HELD
            for n in a.nodes]


def job_nodes(job: JobRow, group: GroupRow, allocs: Sequence[AllocRow]) -> dict[str, list[str]]:
    """The nodes a member uses: its pinned rollout nodes and the first training nodes."""
    pins = next((m.rollout_pins for m in group.plan.members if m.job_id == job.job_id), ())
    rollout = pool_nodes(allocs, "rollout")
    train = pool_nodes(allocs, "train")
    return {"rollout": [rollout[p][1] for p in pins if p < len(rollout)],
            "train": [n for _, n in train[:job.profile.train_nodes]]}


class Executor(Protocol):
    """Decides the steps of a placed job (the group runtime implements this)."""

    phase: str

    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]: ...


class IdleExecutor:
    """One idle step per allocation holding one of the job's nodes."""

    phase = "idle"

    def __init__(self, argv: Sequence[str] = ("sleep", "infinity")) -> None:
        self.argv = tuple(argv)

    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]:
        pins = next((m.rollout_pins for m in group.plan.members if m.job_id == job.job_id), ())
        wanted: dict[int, list[str]] = {}
        owner: dict[int, AllocRow] = {}
        rollout = pool_nodes(allocs, "rollout")
        for p in pins:
            if p < len(rollout):
                a, node = rollout[p]
                wanted.setdefault(a.key, []).append(node)
                owner[a.key] = a
        for a, node in pool_nodes(allocs, "train")[:job.profile.train_nodes]:
            wanted.setdefault(a.key, []).append(node)
            owner[a.key] = a
        env = {"WEAVE_JOB_ID": str(job.job_id), "WEAVE_GROUP": group.label}
        return [JobStep(owner[k], StepSpec(
            name=f"weave-j{job.job_id}-{owner[k].pool}", argv=self.argv, ntasks=len(nodes),
            node_count=len(nodes), nodelist=tuple(nodes), env=env))
            for k, nodes in sorted(wanted.items())]
