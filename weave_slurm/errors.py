"""The one exception hierarchy of weave-slurm.

Exceptions are named for the caller's next move (after flux-core): a
``ConfigError`` means "fix your input", ``InsufficientResources`` means "retry
later", ``InfeasibleRequest`` means "never, as asked". Messages are one line that
names the file, key or flag, quotes the bad value and lists the valid choices.
CLIs turn any ``WeaveError`` into that line and an exit code (``exit_code``).
"""

from __future__ import annotations


class WeaveError(Exception):
    """Base class: every error weave-slurm raises on purpose derives from it."""

    exit_code: int = 1


class ConfigError(WeaveError):
    """Bad user or admin input (site config, job spec, directive, flag)."""

    exit_code = 2


class InfeasibleRequest(WeaveError):
    """The request can never be satisfied as asked (e.g. state larger than any node)."""

    exit_code = 2


class InsufficientResources(WeaveError):
    """The request is valid but cannot be satisfied now; retry later."""


class ServerBusy(InsufficientResources):
    """weaved takes no more connections now: the caller's user holds its share of them
    (or every client slot is taken). Retry once one closes; a closed connection is
    freed as weaved reads its end."""


class NodeUnavailable(InsufficientResources):
    """A node daemon cannot take work now: it is gone, stopping, or restarting its
    worker pool. Not the job's fault: retry after a while, or on a replacement node.
    ``node``: the node whose daemon it is, where the raiser knows it (a fault then
    names that node, not the node of the request that ran into it)."""

    def __init__(self, *args: object, node: str | None = None) -> None:
        super().__init__(*args)
        self.node = node


class NodeGone(NodeUnavailable):
    """A node daemon does not answer: nobody listens, or the connection broke."""


class AuthError(WeaveError):
    """A peer could not prove it is who it must be (its munge credential, or a
    message's MAC): the connection is refused, never retried as is."""


class ExternalCommandError(WeaveError):
    """An outside command failed; carries the evidence."""

    def __init__(self, argv: list[str], returncode: int | None, stdout: str, stderr: str,
                 what: str = "command failed") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = (stderr or stdout).strip().splitlines()
        last = tail[-1] if tail else ""
        super().__init__(f"{what}: {' '.join(self.argv)} (exit {returncode}): {last}")


class StateError(WeaveError):
    """Persistent or shared state is missing, corrupt or owned by someone else."""


class SegmentMissing(StateError):
    """A segment is not (or no longer) on the node: never put, dropped, or listed a
    moment before a writer replaced it."""


class AlreadyEnded(StateError):
    """An operation on a job that has ended (cancel: nothing left to do; scancel is
    quiet about it)."""


class StalePlacement(StateError):
    """A placement decided on jobs that changed meanwhile (cancelled while it was being
    decided): nothing of it was written; decide again on what is pending now."""


class NoCheckpoint(StateError):
    """A restore was asked for a job that has no checkpoint (yet): nothing to retry."""


class VersionMismatch(WeaveError):
    """A weight version or trajectory batch does not match what the receiver expects."""


class GateRefused(VersionMismatch):
    """weave refused a cooperative job's phase request (``weave_slurm.gate``): it would
    break the on-policy barrier (e.g. a train at a version no rollout produced)."""


class PhaseRevoked(StateError):
    """A cooperative job's granted phase was taken back (it ran past its deadline, or
    the job was cancelled): its process must stop."""
