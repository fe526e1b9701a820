"""Test-only fault injection: die as if SIGKILLed at a named point of the control loop.

``WEAVE_FAULT_POINT=<point>:<n>`` in weaved's environment makes the process call
``os._exit(137)`` at the n-th crossing of ``<point>`` (n defaults to 1): no
``finally`` block, no flush, no SQLite close, exactly what ``kill -9`` leaves.
Unset (the normal case) a crossing costs one dictionary lookup. The points sit
right after an intent is made durable and before (or right after) the outside
call it announces, i.e. where a crash is hardest to recover from. Used by
tests/reliability and bench/soak.py; never set it in production.
"""

from __future__ import annotations

import logging
import os
import threading
from enum import StrEnum

log = logging.getLogger(__name__)

ENV = "WEAVE_FAULT_POINT"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL


class FaultPoint(StrEnum):
    SUBMIT_STORED = "submit.stored"  # job row committed, reply not yet sent
    PLACE_COMMITTED = "place.committed"  # placement transaction committed
    ALLOC_INTENT = "alloc.intent"  # ALLOCATING written, allocate call not made
    ALLOC_GRANTED = "alloc.granted"  # allocate call returned, HELD not written
    STEP_INTENT = "step.intent"  # LAUNCHING written, launch call not made
    STEP_LAUNCHED = "step.launched"  # launch call returned, RUNNING not written
    GROUP_ACTIVE = "group.active"  # group FORMING -> ACTIVE written
    JOB_RUNNING = "job.running"  # job PLACED -> RUNNING written (its phase starts)
    JOB_ENDED = "job.ended"  # the runtime reported a job's end, its end not yet stored
    CANCEL_STOPPING = "cancel.stopping"  # step STOPPING written, cancel call not made
    CANCEL_STOPPED = "cancel.stopped"  # a cancelled job's steps stopped, CANCELLED not written
    RELEASE_INTENT = "release.intent"  # RELEASING written, release call not made
    RELEASE_DONE = "release.done"  # release call returned, RELEASED not written


_counts: dict[str, int] = {}
_lock = threading.Lock()


def crossing(point: FaultPoint) -> None:
    """Count a crossing of ``point``; exit 137 if ``$WEAVE_FAULT_POINT`` names this one."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point.value:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _counts[name] == (int(nth) if nth.isdigit() else 1):
            log.critical("fault injection: exiting 137 at %s (crossing %d)", name,
                         _counts[name])
            os._exit(EXIT_CODE)
