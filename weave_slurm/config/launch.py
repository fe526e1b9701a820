"""A cooperative job's ``[launch]`` table: the user's own processes, one line per role.

A spec with ``[launch]`` is a *cooperative* job (docs/job_api.md, "Cooperative jobs"):
weave does not run an ``RLJob`` for it; its own script runs as the submitting user, one
process per role (``rollout`` on its pinned h20 node, ``train`` on its h800 node), and
blocks at each phase boundary in :mod:`weave_slurm.gate` until the group runtime grants
the phase.

```toml
[launch]
rollout = "python job.py --role rollout"    # a shell line per role (bash -c)
train = "torchrun --nproc-per-node 1 job.py --role train"
script = "..."                              # the body run by a role without its own line
object_store_gib = 0.5                      # host memory its processes hold per node
[launch.env]                                # the environment (weave-sbatch: the caller's)
PATH = "/usr/bin:/bin"
```

Where each role's stdout and stderr go is the spec's ``[slurm] output`` and ``error``
(``#SBATCH --output/--error``: :mod:`weave_slurm.config.sbatch`), default
``weave-%j.out`` in the job's working directory; both roles append to the same files.

``object_store_gib`` is host memory the job's processes hold on each of its nodes
besides its declared warm state (a Ray object store, a shared-memory pool): it counts
in the node's host-memory budget (:func:`weave_slurm.model.profile.profile_job`) and is
handed to each role as ``WEAVE_OBJECT_STORE_BYTES`` (``ray start --object-store-memory``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from weave_slurm.config.reader import TableReader
from weave_slurm.errors import ConfigError

#: The roles a cooperative job launches, in launch order (training first: it owns v0).
ROLES = ("train", "rollout")
#: Environment variables weave sets for a launched role (a spec's env cannot set them).
RESERVED_ENV = re.compile(r"^(WEAVE_|SLURM_)")
#: A cooperative job's stdout when its spec names none (sbatch's is slurm-%j.out).
DEFAULT_OUTPUT = "weave-%j.out"
MAX_LINE_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What each role runs, where its output goes and in which environment."""

    rollout: str | None = None
    train: str | None = None
    script: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    object_store_gib: float = 0.0      # per node, in the host-memory budget

    def command(self, role: str) -> str:
        """The shell text of ``role`` (its own line, else the script body)."""
        line = self.rollout if role == "rollout" else self.train
        text = line if line is not None else self.script
        if text is None:   # parse_launch refuses this; a hand-built spec may not
            raise ConfigError(f"launch: no command for role {role!r}; give "
                              f"'launch.{role}' or 'launch.script'")
        return text


def parse_launch(top: TableReader, staleness: int) -> LaunchSpec | None:
    """``[launch]`` of a spec (None: a hosted job)."""
    tab = top.table("launch", required=False)
    if tab is None:
        return None
    lines = {k: _line(tab, k) for k in ("rollout", "train", "script")}
    missing = [r for r in ROLES if lines[r] is None and lines["script"] is None]
    if missing:
        raise ConfigError(f"{top.source}: [launch] has no command for role "
                          f"{', '.join(missing)}: give 'launch.{missing[0]}' or "
                          "'launch.script'")
    if staleness:
        raise top.fail("staleness", staleness, "a cooperative job ([launch]) runs "
                       "strictly on-policy; valid: 0")
    store = tab.number("object_store_gib", 0.0, ge=0.0)
    env = _env(tab)
    tab.done()
    return LaunchSpec(lines["rollout"], lines["train"], lines["script"], env, store)


def _line(tab: TableReader, key: str) -> str | None:
    value = tab.opt_string(key)
    if value is not None and (not value.strip() or len(value) > MAX_LINE_CHARS):
        raise tab.fail(key, value[:60], f"must be a non-empty shell line of at most "
                       f"{MAX_LINE_CHARS} characters")
    return value


def _env(tab: TableReader) -> tuple[tuple[str, str], ...]:
    sub = tab.table("env", required=False)
    if sub is None:
        return ()
    raw = tab.raw("env")
    out = []
    for name, value in sorted(dict(raw).items()):
        if not isinstance(value, str) or "=" in name or not name or RESERVED_ENV.match(name):
            raise sub.fail(name, value, "an environment variable: a name without '=' "
                           "(not WEAVE_* or SLURM_*, weave sets those) and a string value")
        sub.opt_string(name)
        out.append((name, value))
    sub.done()
    return tuple(out)



def exportable(environ: Mapping[str, str]) -> dict[str, str]:
    """The submitter's environment as ``[launch.env]`` keeps it (sbatch's
    ``--export=ALL``), without the variables weave sets itself."""
    return {k: v for k, v in sorted(environ.items())
            if k and "=" not in k and not RESERVED_ENV.match(k) and "\x00" not in v}


def yes(raw: str) -> bool:
    """A directive that is on when given (``#WEAVE --cooperative``)."""
    if raw.lower() not in ("yes", "true", "1", "on"):
        raise ConfigError("takes no value (or yes/true)")
    return True
