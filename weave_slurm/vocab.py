"""The words every layer shares (docs/glossary.md): the two pools and the phases.

One enum per word, used by the site config, placement, the simulator, weaved's group
runtime, the node daemons and the sync. Both are ``StrEnum``s, so a member equals its
value (``Pool.ROLLOUT == "rollout"``) where rows, JSON and TOML carry plain strings.
"""

from __future__ import annotations

from enum import StrEnum

from weave_slurm.errors import ConfigError


class Pool(StrEnum):
    """The two GPU pools of a site and of a group."""

    ROLLOUT = "rollout"   # inference GPUs (h20): rollout phases
    TRAIN = "train"       # training GPUs (h800): training phases

    @classmethod
    def parse(cls, value: object, where: str = "pool") -> Pool:
        try:
            return cls(str(value))
        except ValueError:
            raise ConfigError(f"{where} {value!r} is unknown; valid: "
                              f"{', '.join(p.value for p in cls)}") from None


class Phase(StrEnum):
    """One phase of a job's iteration: rollout -> sync -> train."""

    ROLLOUT = "rollout"
    SYNC = "sync"         # weights train -> rollout (the runtime's own transfer)
    TRAIN = "train"

    @classmethod
    def parse(cls, value: object, where: str = "phase") -> Phase:
        try:
            return cls(str(value))
        except ValueError:
            raise ConfigError(f"{where} {value!r} is unknown; valid: "
                              f"{', '.join(p.value for p in cls)}") from None

    @property
    def pool(self) -> Pool:
        """The pool a phase runs on (a sync runs from the training pool)."""
        return Pool.ROLLOUT if self is Phase.ROLLOUT else Pool.TRAIN
