"""The words every layer shares (docs/glossary.md): the two pools and the phases.

One enum per word, used by the site config, placement, the simulator, weaved's group
runtime, the node daemons and the sync. Both are ``StrEnum``s, so a member equals its
value (``Pool.ROLLOUT == "rollout"``) where rows, JSON and TOML carry plain strings.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import TypeVar

from weave_slurm.errors import ConfigError

_E = TypeVar("_E", bound=Enum)


def member_of(cls: type[_E], value: object, message: str) -> _E:
    """The member of enum ``cls`` whose value is ``value`` (or its string); otherwise a
    one-line ConfigError: ``message`` with ``{value}`` (its repr) and ``{choices}`` (the
    valid values, comma-separated) filled in. Every enum a user names in a file or a
    flag parses through here, each with the words of its own key or flag."""
    for member in cls:
        if member.value == value or member.value == str(value):
            return member
    raise ConfigError(message.format(value=repr(value),
                                     choices=", ".join(str(m.value) for m in cls)))


class Pool(StrEnum):
    """The two GPU pools of a site and of a group."""

    ROLLOUT = "rollout"   # inference GPUs (h20): rollout phases
    TRAIN = "train"       # training GPUs (h800): training phases

    @classmethod
    def parse(cls, value: object, where: str = "pool") -> Pool:
        return member_of(cls, value, where + " {value} is unknown; valid: {choices}")


class Phase(StrEnum):
    """One phase of a job's iteration: rollout -> sync -> train."""

    ROLLOUT = "rollout"
    SYNC = "sync"         # weights train -> rollout (the runtime's own transfer)
    TRAIN = "train"

    @classmethod
    def parse(cls, value: object, where: str = "phase") -> Phase:
        return member_of(cls, value, where + " {value} is unknown; valid: {choices}")

    @property
    def pool(self) -> Pool:
        """The pool a phase runs on (a sync runs from the training pool)."""
        return Pool.ROLLOUT if self is Phase.ROLLOUT else Pool.TRAIN
