"""A member as weaved reads it: a frozen snapshot, not the runtime's live record.

:class:`~weave_slurm.runtime.member.RunningMember` is the runtime's own, changed by
its lifecycle on the runtime thread. weaved (status rows, outcomes, the plan it
follows) reads a :class:`MemberView` instead, taken by the port
(:attr:`GroupPort.members <weave_slurm.runtime.port.GroupPort.members>`): a value that
no later tick changes, holding only what weaved decides or reports on.
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.runtime.group import MemberState, NodeRef
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.profiler import MemberProfile


@dataclass(frozen=True)
class MemberView:
    """One member of a running group, at the moment the port read it."""

    job_id: str
    state: MemberState
    steps: int                        # its iterations
    version: int                      # versions trained
    version_known: bool               # False: adopted, not restored yet (version is 0)
    initialised: bool
    recoveries: int
    error: str | None                 # its last failure, in words
    rewards: tuple[float, ...]
    node: str | None                  # where its phase in flight runs
    current_staleness: int | None
    event: str | None                 # its last fault and what was done (words)
    restart_note: str | None          # why it last started again from scratch
    refusal: str | None               # its gate's last refusal (a cooperative member)
    warning: str | None               # the last warning about it (RunningMember.warn)
    handoff: bool                     # moving to another group at its step boundary
    turns: int                        # steps per round
    cooperative: bool                 # its own processes run it (a launch plan)
    colocated: bool                   # it rolls out on its training node (never re-pinned)
    rollout_nodes: tuple[NodeRef, ...]
    repin: tuple[NodeRef, ...] | None   # where it moves at its next phase boundary
    measured: MemberProfile | None    # the runtime's measurements of it
    pool: tuple[int, ...] | None = None    # pooled: its pool's GPUs per rollout node
    repool: tuple[int, ...] | None = None  # ... and those it has after a pending re-pin

    @property
    def next_rollout_nodes(self) -> tuple[NodeRef, ...]:
        """Its rollout nodes once a pending re-pin is carried out."""
        return self.repin if self.repin is not None else self.rollout_nodes

    @property
    def next_pool(self) -> tuple[int, ...] | None:
        """Its pool once a pending re-pin is carried out (None: not pooled)."""
        return self.repool if self.repin is not None else self.pool


def view_of(m: RunningMember, measured: MemberProfile | None,
            refusal: str | None) -> MemberView:
    """The snapshot of ``m`` (``measured``: its profile; ``refusal``: its gate's)."""
    run = m.running
    return MemberView(
        m.spec.job_id, m.state, m.spec.steps, m.version, m.version_known, m.initialised,
        m.recoveries,
        m.error, tuple(m.rewards), None if run is None else run.node.name,
        None if m.versions is None else m.versions.current_staleness(), m.event(),
        m.restart_note,
        refusal, m.warning, m.handoff, m.spec.turns, m.spec.launch is not None,
        m.spec.colocated, m.rollout_nodes, m.repin, measured, m.spec.pool, m.repool)
