"""What ``weave status`` and a job's outcome say about a member of the group runtime.

Read-only: built from a member's snapshot, what the port gives weaved
(:class:`~weave_slurm.runtime.member_view.MemberView`); the words come from the member's
typed fault (its ``event``). No torch: weaved reads no tensor (a finished member's digest
is computed on its node).
"""

from __future__ import annotations

import threading
from typing import Any

from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.port import GroupPort

#: The PHASE column for each member state.
PHASE_WORDS = {MemberState.STARTING: "init", MemberState.READY: "idle",
               MemberState.ROLLOUT: "rollout", MemberState.TRAIN: "train",
               MemberState.RECOVERING: "recover", MemberState.DONE: "done",
               MemberState.FAILED: "failed", MemberState.CANCELLED: "left",
               MemberState.MOVED: "moving"}


def member_row(m: MemberView) -> dict[str, Any]:
    """One member as ``weave status`` / ``weave show job`` read it."""
    prof = m.measured
    row: dict[str, Any] = {
        "phase": PHASE_WORDS[m.state], "iterations": m.steps,
        # unknown (None) until a re-attached member is restored from its checkpoint
        "version": m.version if m.version_known else None,
        "node": m.node, "reward": m.rewards[-1] if m.rewards else None,
        "rewards": list(m.rewards), "recoveries": m.recoveries, "error": m.error,
        "member_state": m.state.value,
        "event": _event(m),
        "current_staleness": m.current_staleness}
    if prof is not None:
        row.update({"slowdown": prof.slowdown, "slo_ok": prof.slo_ok,
                    "drift": list(prof.drift), "measured": prof.to_json()})
    return row


def _event(m: MemberView) -> str | None:
    """Its last fault, else why it started over, else its gate's last refusal; and the
    last warning about it."""
    words = m.event or m.restart_note or m.refusal
    if m.warning is None:
        return words
    return f"{words}; warning: {m.warning}" if words else f"warning: {m.warning}"


def outcome_words(m: MemberView) -> str:
    """Why a DONE or FAILED member ended, with its faults in words."""
    done = m.state is MemberState.DONE
    why = (f"reached version {m.version}/{m.steps}" if done
           else f"runtime gave up: {m.error or 'unknown'}")
    event = m.event
    n = m.recoveries
    if event is not None:
        why += f" after {n} recover{'y' if n == 1 else 'ies'} (last: {event})"
    if m.restart_note is not None:
        why += f"; earlier: {m.restart_note}"
    if m.warning is not None:
        why += f"; warning: {m.warning}"
    return why


def kept_final(row: dict[str, Any] | None, m: MemberView) -> bool:
    """Whether ``row`` is the last row kept of ``m``, ended and not yet left
    (daemon/member_exit.py: the final row holds its weights' digest)."""
    return row is not None and row.get("phase") == "-" \
        and row.get("member_state") == m.state.value \
        and m.state in (MemberState.DONE, MemberState.FAILED)


class LiveRows:
    """Each job's status row (:func:`member_row`), as ``weave status`` reads it: a
    snapshot of each group's port, refreshed at most every ``every_s`` by that group's
    worker (API threads never touch a node daemon, nor wait on a group's lock); a job
    that left keeps its last row."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._rows: dict[int, dict[str, Any]] = {}
        self._at: dict[int, float] = {}      # group -> when its rows were last refreshed
        self._write = threading.Lock()       # writers are the groups' workers

    def refresh(self, group_id: int, port: GroupPort, now: float,
                force: bool = False) -> None:
        """The rows of ``port``'s members (``now``: a monotonic clock's)."""
        last = self._at.get(group_id)
        if not force and last is not None and now - last < self.every_s:
            return
        self._at[group_id] = now
        rows = self._rows
        new = {int(key): member_row(m) for key, m in port.members.items()
               if m.state is not MemberState.CANCELLED
               and not kept_final(rows.get(int(key)), m)}   # an ended one's last row stays
        with self._write:   # one swap: a reader sees the old rows or the new ones
            self._rows = {**self._rows, **new}

    def forget(self, group_id: int) -> None:
        """The group's runtime closed (its jobs keep their last rows)."""
        self._at.pop(group_id, None)

    def put(self, job_id: int, row: dict[str, Any]) -> None:
        """A job's last row (it left, ended or its group lost nodes)."""
        with self._write:
            self._rows = {**self._rows, job_id: row}

    def get(self, job_id: int) -> dict[str, Any] | None:
        return self._rows.get(job_id)
