"""A member leaves its group's runtime (docs/daemon.md): a DONE hosted member's final
weights are read first, its last status row is kept, and an ended member's outcome says
why in words (:func:`~weave_slurm.daemon.runtime_view.outcome_words`)."""

from __future__ import annotations

import logging

from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.daemon.runtime_view import LiveRows, member_row, outcome_words
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import WeaveError
from weave_slurm.runtime import port_commands as cmd
from weave_slurm.runtime.group import MemberState
from weave_slurm.runtime.member_view import MemberView
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_events import Digested

log = logging.getLogger(__name__)


def ended(port: GroupPort, rows: LiveRows, job_id: int, member: MemberView) -> JobOutcome:
    """A DONE or FAILED member leaves; its outcome, with its faults in words."""
    done = member.state is MemberState.DONE
    why = outcome_words(member)
    note = leave(port, rows, member)
    if note is not None:
        why += f"; warning: {note}"
    return JobOutcome(job_id, JobState.COMPLETED if done else JobState.FAILED, why,
                      (rows.get(job_id) or {}).get("weights_sha256"))


def leave(port: GroupPort, rows: LiveRows, member: MemberView) -> str | None:
    """``member`` leaves the port (a DONE hosted one's final weights read first); what
    went wrong that its outcome must say (None: nothing)."""
    key = member.job_id
    note = None
    final = {**member_row(member), "phase": "-"}
    if member.state is MemberState.DONE and not member.cooperative:   # hosted:
        # record what it learned before the drop (a cooperative job's is its own)
        try:
            for event in port.apply(cmd.FinalDigest(key)):
                if isinstance(event, Digested):
                    final["weights_sha256"] = event.sha256
        except (WeaveError, OSError) as exc:
            note = f"its final weights could not be read (no SHA-256 to show): {exc}"
            log.warning("job %s: %s", key, note)
    rows.put(int(key), final)
    try:
        port.apply(cmd.Leave(key))
    except WeaveError as exc:   # it ended; what its nodes kept is swept with the group
        log.warning("leave of job %s: %s", key, exc)
    return note
