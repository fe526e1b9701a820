"""Which jobs a ``weave status`` or ``weave cancel`` means, with squeue's and scancel's
options: ``-t`` states, ``-p`` partitions, ``-n`` names, ``-u`` users, ``--me``, and
``weave status -S`` sort keys.

States are given as squeue takes them: full names or the short codes of the ST column
(``PD``, ``CF``, ``R``, ``CG``, ``CA``, ``CD``, ``F``...), comma-separated, any case,
or ``all``. A state that has ended makes ``weave status`` ask weaved for ended jobs
too (as ``squeue -t CD`` lists completed jobs while Slurm remembers them).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from weave_slurm.daemon.states import JobState
from weave_slurm.errors import ConfigError


def split_list(values: Sequence[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (an option given once with commas or
    several times)."""
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def parse_states(values: Sequence[str] | None, flag: str = "--states") -> frozenset[JobState]:
    """The states named by ``-t`` (empty: no filter); one line naming the bad one and the
    valid names and codes otherwise."""
    by_word = {s.value: s for s in JobState} | {s.short: s for s in JobState}
    out: set[JobState] = set()
    for word in split_list(values):
        if word.upper() == "ALL":
            return frozenset(JobState)
        state = by_word.get(word.upper())
        if state is None:
            valid = ", ".join(f"{s.value} ({s.short})" for s in JobState)
            raise ConfigError(f"{flag}: invalid job state {word!r}; valid: {valid}, all")
        out.add(state)
    return frozenset(out)


def me() -> str:
    """This process's user name (its uid when it has no passwd entry)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


@dataclass(frozen=True)
class Selection:
    """Filters over job rows (the ``status`` op's): each empty one selects all."""

    states: frozenset[JobState] = frozenset()
    partitions: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    @property
    def wants_ended(self) -> bool:
        """Whether an ended state is asked for (weaved lists ended jobs only on ask)."""
        return any(s.final for s in self.states)

    def request(self) -> dict[str, list[str]]:
        """The filters as the ``status`` op takes them (weaved applies them)."""
        return {"states": sorted(s.value for s in self.states),
                "names": sorted(self.names), "partitions": sorted(self.partitions)}

    @property
    def empty(self) -> bool:
        return not (self.states or self.partitions or self.names)

    def __call__(self, row: dict[str, Any]) -> bool:
        return ((not self.states or JobState(row["state"]) in self.states)
                and (not self.names or row["name"] in self.names)
                and (not self.partitions
                     or bool(self.partitions & set(row.get("partitions") or []))))


def selection(states: Sequence[str] | None, partitions: Sequence[str] | None,
              names: Sequence[str] | None) -> Selection:
    return Selection(parse_states(states), frozenset(split_list(partitions)),
                     frozenset(split_list(names)))


def users_of(users: Sequence[str] | None, mine: bool) -> list[str]:
    """The users named by ``-u a,b`` and ``--me`` together."""
    out = split_list(users)
    return [*out, me()] if mine else out


#: ``-S`` keys: squeue's format letters that make sense to sort on, and their values.
SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "i": lambda j: int(j["job"]),
    "u": lambda j: str(j["user"]),
    "j": lambda j: str(j["name"]),
    "g": lambda j: -1 if j["group"] is None else int(j["group"]),
    "T": lambda j: str(j["state"]),
    "t": lambda j: JobState(j["state"]).short,
    "M": lambda j: float(j["time_s"]),
    "V": lambda j: float(j.get("submitted_s") or 0.0),
    "D": lambda j: len(j["nodes"]),
    "p": lambda j: str(j["phase"]),
}


def sort_rows(rows: list[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """``rows`` ordered as ``squeue -S spec`` would: comma-separated keys, each a format
    letter with an optional ``+`` (ascending, the default) or ``-`` (descending); the
    first key counts most. None: by job id."""
    keys = [k.strip() for k in (spec or "i").split(",") if k.strip()]
    out = list(rows)
    for key in reversed(keys):   # a stable sort per key, the least significant first
        desc = key.startswith("-")
        letter = key.lstrip("+-")
        if letter not in SORT_KEYS:
            raise ConfigError(f"--sort: unknown key {key!r}; valid: "
                              f"{', '.join(SORT_KEYS)} (each with an optional + or -)")
        out.sort(key=SORT_KEYS[letter], reverse=desc)
    return out
