"""Errors raised by the weight sync (the one door to collective communication).

Stale or duplicate weight versions raise :class:`weave_slurm.errors.VersionMismatch`;
everything else that goes wrong on the wire raises a :class:`SyncError`.
"""

from __future__ import annotations

from weave_slurm.errors import WeaveError


class SyncError(WeaveError):
    """A weight transfer failed: a peer died, timed out, or the bytes arrived corrupt."""


class AgentDidNotStart(SyncError):
    """A sync agent's step exited before its rendezvous: Slurm could not start it on
    its node (e.g. that node's slurmd does not answer). The node's fault, not the job's."""


class ShardCorrupt(SyncError):
    """A shard failed its checksum on the first attempt and again on the retry."""
