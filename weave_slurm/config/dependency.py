"""sbatch's ``--dependency``: when a job may start, in terms of other jobs.

``TYPE:ID[:ID...][,TYPE:ID...]``, every part required (sbatch's ``,``; its ``?``, "any
of", is not taken), with the types sbatch has for whole jobs:

- ``after``: each ID has started (or ended);
- ``afterany``: each ID has ended, however;
- ``afterok``: each ID completed (a failed or cancelled one never lets it start);
- ``afternotok``: each ID failed, was cancelled or refused (a completed one never lets
  it start).

The IDs are weave job ids (``weave-sbatch --parsable`` prints them). Checked here for
form; weaved checks that each ID exists when the job is submitted, and holds the job
PENDING, its REASON saying which one it waits for (``daemon/dependencies.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_slurm.errors import ConfigError

#: The dependency types weave takes, as sbatch names them.
KINDS = ("after", "afterany", "afterok", "afternotok")
FORMS = "TYPE:ID[:ID...][,TYPE:ID...] with TYPE one of " + ", ".join(KINDS)


@dataclass(frozen=True, slots=True)
class Dependency:
    """One part of a ``--dependency``: its type and the jobs it names."""

    kind: str
    job_ids: tuple[int, ...]

    def __str__(self) -> str:
        return ":".join((self.kind, *map(str, self.job_ids)))


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """The parts of ``text`` (ConfigError naming the bad part and the valid forms)."""
    if "?" in text:
        raise ConfigError(f"'{text}': '?' (any of) is not taken; give parts that must all "
                          f"hold, separated by ',' ({FORMS})")
    parts = []
    for part in text.split(","):
        kind, _, ids = part.strip().partition(":")
        numbers = ids.split(":") if ids else []
        if kind not in KINDS or not numbers or not all(n.isdigit() for n in numbers):
            raise ConfigError(f"'{part.strip()}' is not a dependency; valid: {FORMS} "
                              "(e.g. afterok:12:13)")
        parts.append(Dependency(kind, tuple(int(n) for n in numbers)))
    return tuple(parts)


def dependency_text(text: str) -> str:
    """``text`` checked and written as weave keeps it (``afterok:12,after:3``)."""
    return ",".join(map(str, parse_dependency(text)))
