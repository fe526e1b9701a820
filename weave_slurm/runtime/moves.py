"""Moving a member's segments between its nodes, each move recorded (profile, timeline)."""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.clock import Clock
from weave_slurm.runtime.group import NodeRef
from weave_slurm.runtime.member import Member
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.timeline import Span
from weave_slurm.runtime.transfer import WeightTransfer
from weave_slurm.vocab import Phase


class Mover:
    """Copies segments through the group's weight transfer; records a sync per copy."""

    def __init__(self, transfer: WeightTransfer, profiler: LiveProfiler, spans: list[Span],
                 clock: Clock) -> None:
        self.transfer, self.profiler, self.spans, self.clock = transfer, profiler, spans, clock

    def copy(self, member: Member, name: str, src: NodeRef, dsts: Sequence[NodeRef],
             what: str, as_name: str | None = None) -> None:
        """Copy segment ``name`` to ``dsts`` (``as_name``: into that checked buffer)."""
        start = self.clock.now()
        _, moved = self.transfer.copy(src, dsts, member.job, name, as_name)
        end = self.clock.now()
        self.profiler.sync(member.spec.job_id, what, moved)
        self.profiler.phase(member.spec.job_id, Phase.SYNC, end - start)
        self.spans.append(Span(member.spec.job_id, Phase.SYNC, src.name, src.pool,
                               start, end))
