"""The seam between weaved's control plane and what runs in the groups' allocations.

The reconcile loop asks a :class:`Driver` which steps a placed job runs inside
its group's allocations and launches them (write-ahead, like everything else), then
lets it :meth:`~Driver.drive` its groups once per tick and applies the job
outcomes it reports. :class:`IdleDriver` holds each job's nodes with an idle step
per allocation the job uses (PHASE ``idle``); the group runtime
(:mod:`weave_slurm.daemon.group_runtime`) runs no step per job and drives the
rollout / sync / train phases on the node daemons instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from weave_slurm.daemon import allocplan
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow
from weave_slurm.daemon.states import AllocState, JobState
from weave_slurm.slurm.backend import StepSpec

if TYPE_CHECKING:
    from weave_slurm.daemon.store import Store


@dataclass(frozen=True)
class JobStep:
    """One step of a job and the allocation it runs in."""

    alloc: AllocRow
    spec: StepSpec


def pool_nodes(allocs: Sequence[AllocRow], role: str) -> list[tuple[AllocRow, str]]:
    """A group's held nodes of one role, in allocation order: (allocation, node)."""
    return [(a, n) for a in allocs if a.role == role and a.state is AllocState.HELD
            for n in a.held_nodes]


def pinned_nodes(job: JobRow, group: GroupRow,
                 allocs: Sequence[AllocRow]) -> list[tuple[AllocRow, str]]:
    """The held rollout nodes the job's pins name (``allocs``: every row of the group,
    ended ones too: a pin is a slot, :mod:`~weave_slurm.daemon.allocplan`)."""
    pins = next((m.rollout_pins for m in group.plan.members if m.job_id == job.job_id), ())
    held = allocplan.held_nodes(allocs)
    return [held[p] for p in pins if p in held]


def job_nodes(job: JobRow, group: GroupRow, allocs: Sequence[AllocRow]) -> dict[str, list[str]]:
    """The nodes a member uses: its pinned rollout nodes and the first training nodes."""
    train = pool_nodes(allocs, "train")
    return {"rollout": [n for _, n in pinned_nodes(job, group, allocs)],
            "train": [n for _, n in train[:job.profile.train_nodes]]}


@dataclass(frozen=True)
class JobOutcome:
    """A running job the driver says has ended (COMPLETED or FAILED) or is requeued
    (PENDING: its group could not start it, daemon/waits.py), and why; a hosted job
    that completed, with the SHA-256 of its final weights (stored with its end)."""

    job_id: int
    state: JobState
    reason: str
    weights_sha256: str | None = None


class DriverKind(StrEnum):
    """Which driver weaved runs (``weave daemon --runtime``)."""

    AUTO = "auto"   # rl, unless a site's node_command replaces weave's node daemon
    RL = "rl"       # the group runtime drives the RL phases on the node daemons
    IDLE = "idle"   # one idle step per job and allocation (holds the nodes)


class Driver(Protocol):
    """Decides the steps of a placed job and drives what runs (the group runtime)."""

    phase: str
    wake: Callable[[], None]  # set by the daemon: run the reconcile loop soon

    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]: ...

    def drive(self, store: Store, now: float) -> list[JobOutcome]:
        """Once per reconcile tick (the loop owns the store): the jobs that ended."""
        ...

    def release_group(self, group_id: int) -> None:
        """Before the group's node daemons are stopped: let go of its members (their
        state on the nodes dropped while the daemons still answer)."""
        ...

    def in_use(self, group_id: int) -> frozenset[str]:
        """The group's nodes the driver still uses, by name (a share's node: its node
        daemon's key, ``allocplan.node_key``): an allocation the group no longer needs
        is returned only once none of its nodes is among them."""
        ...

    def leave(self, alloc: AllocRow, nodes: Sequence[str]) -> None:
        """Before ``nodes`` of ``alloc`` are given back to Slurm (a shrink): end their
        node daemons, best effort (allocplan's "Spare nodes")."""
        ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    def live(self, job_id: int) -> dict[str, Any] | None:
        """Live runtime fields of a job for status views (None: nothing to add)."""
        ...

    def waiting(self, job_id: int) -> str | None:
        """Why a running job's phases have not started, in words (None: they have, or
        nothing holds them up)."""
        ...


class IdleDriver:
    """One idle step per allocation holding one of the job's nodes."""

    phase = "idle"

    def __init__(self, argv: Sequence[str] = ("sleep", "infinity")) -> None:
        self.argv = tuple(argv)
        self.wake: Callable[[], None] = lambda: None

    def drive(self, store: Store, now: float) -> list[JobOutcome]:
        return []

    def release_group(self, group_id: int) -> None:
        return None

    def in_use(self, group_id: int) -> frozenset[str]:
        return frozenset()   # its idle steps are job steps: the loop sees them

    def leave(self, alloc: AllocRow, nodes: Sequence[str]) -> None:
        return None   # no node daemon of its own

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None

    def live(self, job_id: int) -> dict[str, Any] | None:
        return None

    def waiting(self, job_id: int) -> str | None:
        return None

    def job_steps(self, job: JobRow, group: GroupRow,
                  allocs: Sequence[AllocRow]) -> list[JobStep]:
        wanted: dict[int, list[str]] = {}
        owner: dict[int, AllocRow] = {}
        for a, node in pinned_nodes(job, group, allocs):
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
