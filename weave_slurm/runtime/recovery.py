"""Failure isolation of the group executor (functions of
:class:`~weave_slurm.runtime.executor.GroupExecutor`).

A failure touches only its member: what it runs is stopped, and it is re-admitted from
the newest checkpoint on its training node (weights copied to its rollout nodes) while
the others keep running. Its own faults spend the budget ``max_recoveries``; a node
that is gone, stopping or restarting (``NodeUnavailable``) is waited for up to
``node_wait_s`` (see :meth:`~weave_slurm.runtime.member.Member.charge`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from weave_slurm.errors import NoCheckpoint, NodeUnavailable, StateError, WeaveError
from weave_slurm.node.protocol import Op
from weave_slurm.runtime import phases
from weave_slurm.runtime.group import MemberState, PhaseKind
from weave_slurm.runtime.member import Member
from weave_slurm.runtime.ordering import rollout_version
from weave_slurm.runtime.staleness import WEIGHTS_BUFFER, buffer_name
from weave_slurm.runtime.timeline import Span

if TYPE_CHECKING:
    from weave_slurm.runtime.executor import GroupExecutor

log = logging.getLogger("weave_slurm.runtime.executor")   # one logger for the executor


def fail(gx: GroupExecutor, member: Member, why: str, node_fault: bool = False) -> None:
    """Only this member: stop what it runs, then re-admit it from its checkpoint.

    ``node_fault``: a node daemon was gone, stopping or restarting its pool. That is
    not the member's fault, so it costs no recovery budget; the member waits up to
    ``node_wait_s`` for the node (weaved replaces a lost allocation meanwhile).
    """
    log.warning("member %s failed: %s", member.spec.job_id, why)
    member.charge(node_fault, gx.clock.now())
    for run in list(member.runs.values()):
        if not run.ended:
            gx.spans.append(Span(member.spec.job_id, run.kind, run.node.name,
                                 run.node.pool, run.start_s, gx.clock.now(), ok=False))
            try:
                gx._call(run.node, Op.DEACTIVATE, job=member.spec.job_id)
            except WeaveError as exc:
                log.info("deactivate of %s on %s: %s", member.spec.job_id,
                         run.node.name, exc)
        gx._release(member, run)
    gx._ended = [e for e in gx._ended if e[0] is not member]
    member.deferred.clear()
    member.error = why
    if member.state is MemberState.STARTING:
        gx._move(member, MemberState.FAILED, why)
        return
    if member.state is not MemberState.RECOVERING:
        gx._move(member, MemberState.RECOVERING, why)


def recover(gx: GroupExecutor, member: Member) -> bool:
    """Restore the newest checkpoint on the training node; weights to rollout nodes."""
    if gx.clock.now() < member.retry_at_s:
        return False
    why = member.given_up(gx.config, gx.clock.now())
    if why is not None:
        gx._move(member, MemberState.FAILED, why)
        return True
    member.recoveries += 1
    job_id = member.spec.job_id
    with contextlib.suppress(WeaveError):
        gx._register(member)   # a restarted node daemon may have lost it
    try:
        gx._call(member.train_node, Op.RESTORE, job=job_id)
        info = gx._call(member.train_node, Op.ATTACH_INFO, job=job_id)
        member.version = int(info["segments"][phases.STATE]["index"]["version"])
        gx.transfer.forget(member.job)   # versions start over from the checkpoint
        restore_weights(gx, member, info)
    except NoCheckpoint as exc:   # not transient: no retry can find one
        member.error = f"recovery {member.recoveries}: {exc}"
        gx._move(member, MemberState.FAILED, member.error)
        return True
    except WeaveError as exc:
        member.error = f"recovery {member.recoveries}: {exc}"
        member.charge(isinstance(exc, NodeUnavailable), gx.clock.now())
        member.retry_at_s = gx.clock.now() + member.backoff_s(gx.config)
        log.warning("member %s: %s", job_id, member.error)
        return False
    member.node_fault_since = None
    del member.rewards[member.version:]
    member.rolled = member.delivered = member.version
    if member.versions is not None:
        member.versions.rewind(member.version)
    member.next_kind = PhaseKind.ROLLOUT
    gx._move(member, MemberState.READY, f"re-admitted from checkpoint "
             f"v{member.version} (recovery {member.recoveries})")
    return True


def restore_weights(gx: GroupExecutor, member: Member, info: Mapping[str, Any]) -> None:
    """Rollout nodes get the restored weights (k >= 1: every version a replay needs)."""
    k = member.staleness
    if k == 0:
        gx._sync(member, phases.WEIGHTS, member.train_node, member.rollout_nodes,
                 "weights")
        return
    for version in range(rollout_version(member.version, k), member.version + 1):
        buf = buffer_name(WEIGHTS_BUFFER, version, k)
        held = dict(info["segments"].get(buf) or {}).get("index", {}).get("version")
        if held != version:
            raise StateError(f"member {member.spec.job_id}: its checkpoint's buffer {buf} "
                             f"holds version {held!r}; the replay needs v{version}")
        gx._sync(member, buf, member.train_node, member.rollout_nodes, "weights", buf)
