"""``Op.LEAVE``: weaved gives a node daemon's node back to Slurm (a pooled group's spare
node, daemon/allocplan.py "Spare nodes").

Slurm's shrink of the allocation (``scontrol update JobId=X NodeList=...``) SIGKILLs the
daemon's task on that node, which would leave its root in /dev/shm; so weaved asks the
daemon to end first, and it ends as on the end of its allocation (node/ending.py: every
job's state dropped, its root removed at once, the process gone), through the hook
``weave node serve`` gives it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from weave_slurm.errors import StateError

#: What the node daemon's process does to end itself, given why (None: it cannot).
OnLeave = Callable[[str], None]


def leave(on_leave: OnLeave | None, uid: int) -> dict[str, Any]:
    """Answer ``Op.LEAVE`` from ``uid``: only weaved (root or the daemon's own uid)
    may ask; the daemon ends itself through ``on_leave``."""
    if uid not in (0, os.geteuid()):
        raise StateError(f"leave: only weaved (root or this daemon's uid) may ask; uid "
                         f"{uid} may not")
    if on_leave is None:
        raise StateError("leave: this node daemon does not run as its own process")
    on_leave("weaved gave this node back to Slurm")
    return {"leaving": True}
