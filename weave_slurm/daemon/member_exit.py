"""A member leaves its group's runtime (docs/daemon.md): a DONE hosted member's final
weights are read first, its last status row is kept, and an ended member's outcome says
why in words (:func:`~weave_slurm.daemon.runtime_view.outcome_words`)."""

from __future__ import annotations

import logging

from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.daemon.runtime_view import LiveRows, kept_final, member_row, outcome_words
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import WeaveError
from weave_slurm.runtime import port_commands as cmd
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_events import Digested

log = logging.getLogger(__name__)


def ended(port: GroupPort, rows: LiveRows, job_id: int, member: MemberView) -> JobOutcome:
    """A DONE or FAILED member's outcome, with its faults in words, and its last row (a
    DONE hosted member's final weights read). It stays on its nodes until the store has
    that outcome: its group's next round lets it :func:`leave` then. Left here, a weaved
    killed before the outcome was stored found the job running, its state gone, and
    started it afresh."""
    done = member.state is MemberState.DONE
    why = outcome_words(member)
    note = final_row(port, rows, member)
    if note is not None:
        why += f"; warning: {note}"
    return JobOutcome(job_id, JobState.COMPLETED if done else JobState.FAILED, why,
                      (rows.get(job_id) or {}).get("weights_sha256"))


def final_row(port: GroupPort, rows: LiveRows, member: MemberView) -> str | None:
    """Keep ``member``'s last row, a DONE hosted one's final weights read first (once: a
    row kept already is kept); what went wrong that its outcome must say (None:
    nothing)."""
    key = member.job_id
    kept = rows.get(int(key))
    hosted_done = member.state is MemberState.DONE and not member.cooperative
    if kept is not None and kept_final(kept, member) \
            and ("weights_sha256" in kept or not hosted_done):
        return None
    note = None
    final = {**member_row(member), "phase": "-"}
    if hosted_done:
        # record what it learned before the drop (a cooperative job's is its own)
        try:
            for event in port.apply(cmd.FinalDigest(key)):
                if isinstance(event, Digested):
                    final["weights_sha256"] = event.sha256
        except (WeaveError, OSError) as exc:
            note = f"its final weights could not be read (no SHA-256 to show): {exc}"
            log.warning("job %s: %s", key, note)
    rows.put(int(key), final)
    return note


def leave(port: GroupPort, rows: LiveRows, member: MemberView) -> str | None:
    """``member`` leaves the port, its last row kept (:func:`final_row`); what went
    wrong that its outcome must say (None: nothing)."""
    note = final_row(port, rows, member)
    try:
        port.apply(cmd.Leave(member.job_id))
    except WeaveError as exc:   # it ended; what its nodes kept is swept with the group
        log.warning("leave of job %s: %s", member.job_id, exc)
    return note
