"""Moving a member's segments between its nodes: the transfer a group uses
(:func:`make_transfer`), and each move recorded (profile, timeline)."""

from __future__ import annotations

from collections.abc import Sequence

from weave_slurm.clock import Clock
from weave_slurm.config.runtime import WeightTransferKind
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.agents import Launcher
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.profiler import LiveProfiler
from weave_slurm.runtime.timeline import NoObserver, Span, TimelineObserver
from weave_slurm.runtime.transfer import (
    ClientFactory,
    NodeCall,
    ShmTransfer,
    TransferConfig,
    WeightTransfer,
)
from weave_slurm.runtime.twotier_transfer import TwoTierTransfer
from weave_slurm.vocab import Phase


class Mover:
    """Copies segments through the group's weight transfer; records a sync per copy."""

    def __init__(self, transfer: WeightTransfer, profiler: LiveProfiler, spans: list[Span],
                 clock: Clock, observer: TimelineObserver | None = None) -> None:
        self.transfer, self.profiler, self.spans, self.clock = transfer, profiler, spans, clock
        self.observer = observer or NoObserver()

    @property
    def shards(self) -> bool:
        """Does a training gang over several nodes send its weights from each of them?
        (the two-tier sync; the shared-memory handoff copies from rank 0's node)"""
        return isinstance(self.transfer, TwoTierTransfer)

    def copy(self, member: RunningMember, name: str, src: NodeRef, dsts: Sequence[NodeRef],
             what: str, as_name: str | None = None, from_gang: bool = False) -> None:
        """Copy segment ``name`` to ``dsts`` (``as_name``: into that checked buffer;
        ``from_gang``: the training gang's weights, sent from each of its nodes).

        A destination that is ``src`` itself under the same name already holds it (a
        co-located member's weights and batches, docs/runtime.md "Co-located members"):
        nothing moves, and when nothing else is asked the sync is recorded as what it
        is, 0 bytes in 0 s, with no span on the timeline.
        """
        dsts = [d for d in dsts if d != src or as_name not in (None, name)]
        if not dsts:
            self.profiler.sync(member.spec.job_id, what, 0)
            self.profiler.phase(member.spec.job_id, Phase.SYNC, 0.0)
            return
        start = self.clock.now()
        senders = member.gang.weight_senders() if from_gang and member.gang else ()
        if senders and isinstance(self.transfer, TwoTierTransfer):
            _, moved = self.transfer.copy(src, dsts, member.job, name, as_name, senders)
        else:
            _, moved = self.transfer.copy(src, dsts, member.job, name, as_name)
        end = self.clock.now()
        self.profiler.sync(member.spec.job_id, what, moved)
        self.profiler.phase(member.spec.job_id, Phase.SYNC, end - start)
        self.spans.append(Span(member.spec.job_id, Phase.SYNC, src.name, src.pool,
                               start, end))
        self.observer.synced(self.spans[-1], what, moved)


def make_transfer(config: TransferConfig, layout: GroupLayout, clients: ClientFactory,
                  call: NodeCall | None = None,
                  launcher: Launcher | None = None) -> WeightTransfer:
    """The transfer ``config`` asks for (``clients``: local clients by socket path;
    ``call``: a request to a node daemon; ``launcher``: how agents are started)."""
    remote = [n.name for n in (*layout.train, *layout.rollout) if n.remote]
    kind = config.kind
    if kind is WeightTransferKind.AUTO:
        kind = WeightTransferKind.TWOTIER if remote else WeightTransferKind.SHM
    if kind is WeightTransferKind.SHM:
        if remote:
            raise ConfigError(f"weight_transfer 'shm': nodes {', '.join(remote)} are other "
                              "hosts than weaved's (no shared memory to hand off through); "
                              "valid there: twotier, auto")
        return ShmTransfer(clients)
    return TwoTierTransfer(layout, clients, config, call, launcher)
