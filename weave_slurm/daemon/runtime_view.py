"""What ``weave status`` and a job's outcome say about a member of the group runtime.

Read-only: built from a :class:`~weave_slurm.runtime.member.Member` and its runner's
profiler; the words come from the member's typed fault (``RunningMember.event``). No torch:
weaved reads no tensor (a finished member's digest is computed on its node).
"""

from __future__ import annotations

from typing import Any

from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.runner import GroupRunner

#: The PHASE column for each member state.
PHASE_WORDS = {MemberState.STARTING: "init", MemberState.READY: "idle",
               MemberState.ROLLOUT: "rollout", MemberState.TRAIN: "train",
               MemberState.RECOVERING: "recover", MemberState.DONE: "done",
               MemberState.FAILED: "failed", MemberState.CANCELLED: "left",
               MemberState.MOVED: "moving"}


def member_row(runner: GroupRunner, m: RunningMember) -> dict[str, Any]:
    """One member as ``weave status`` / ``weave show job`` read it."""
    prof = runner.profiler.snapshot().get(m.spec.job_id)
    st = m.status_row()
    row: dict[str, Any] = {
        "phase": PHASE_WORDS[m.state], "iterations": m.spec.steps,
        # unknown (None) until a re-attached member is restored from its checkpoint
        "version": None if m.state is MemberState.RECOVERING and m.recoveries == 0
        and m.initialised else m.version,
        "node": st.get("node"), "reward": m.rewards[-1] if m.rewards else None,
        "rewards": list(m.rewards), "recoveries": m.recoveries, "error": m.error,
        "member_state": m.state.value,
        # its last fault, else why it started over, else its gate's last refusal
        "event": m.event() or m.restart_note or runner.coop.refusal(m.spec.job_id),
        "current_staleness": st.get("current_staleness")}
    if prof is not None:
        row.update({"slowdown": prof.slowdown, "slo_ok": prof.slo_ok,
                    "drift": list(prof.drift), "measured": prof.to_json()})
    return row


def outcome_words(m: RunningMember) -> str:
    """Why a DONE or FAILED member ended, with its faults in words."""
    done = m.state is MemberState.DONE
    why = (f"reached version {m.version}/{m.spec.steps}" if done
           else f"runtime gave up: {m.error or 'unknown'}")
    event = m.event()
    n = m.recoveries
    if event is not None:
        why += f" after {n} recover{'y' if n == 1 else 'ies'} (last: {event})"
    if m.restart_note is not None:
        why += f"; earlier: {m.restart_note}"
    return why
