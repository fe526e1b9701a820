"""How the members of a group that lost nodes go on (a pure decision per member).

When an allocation of a group vanishes (its node went down), weaved stops driving the
group without dropping anything and holds each member's :class:`Resume` until the
group is active on a new allocation, where ``Lifecycle.adopt`` carries it out:

- its training node survived: re-admitted from its warm state and node checkpoint
  there (``WARM``);
- its training node (or a node of its training gang) was lost, but its newest
  checkpoint is under that node's root on a file system weaved shares with the nodes:
  moved to the new training node (each gang rank's from its own old node's root to
  its new node) and re-admitted from it (``CARRIED``);
- lost during its first phase: nothing learned yet, started again from scratch
  (``FRESH``);
- otherwise it is not resumable (``FAILED``); a member that had ended already is
  reported as it ended (``ENDED``), unless its training node was lost before weaved
  read its final weights: then it is carried from its final checkpoint like the above,
  and ends again on the new node, where they are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from weave_slurm.errors import WeaveError
from weave_slurm.hosted import contract
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import MemberState, NodeRef
from weave_slurm.runtime.member import RunningMember


class ResumeKind(StrEnum):
    WARM = "warm"
    CARRIED = "carried"
    FRESH = "fresh"
    FAILED = "failed"
    ENDED = "ended"


@dataclass(frozen=True)
class Resume:
    """How one member goes on, and the words for it."""

    kind: ResumeKind
    why: str = ""               # what happened and what comes next (status meanwhile)
    readmit: str | None = None  # the cause shown once it is re-admitted (WARM, CARRIED)
    note: str | None = None     # FRESH: why it started again from scratch
    root: Path | None = None    # CARRIED: the lost node's checkpoint root
    # CARRIED, a training gang: the checkpoint roots of its ranks 1.. (in rank order)
    rank_roots: tuple[Path, ...] = ()
    # CARRIED: the version of that checkpoint; WARM: the version it had reached (None:
    # nothing learned yet)
    version: int | None = None


def plan_detach(members: Sequence[RunningMember], lost: Sequence[NodeRef],
                checkpoint_base: Path | None) -> dict[str, Resume]:
    """Each member's :class:`Resume` after ``lost`` vanished (``checkpoint_base``: the
    shared root holding ``<base>/<node>`` checkpoint roots, None if weaved has none)."""
    names = ", ".join(f"{r.pool.value} node {r.name}" for r in lost)
    return {m.spec.job_id: _resume(m, names, any(n in lost for n in _train_nodes(m)),
                                   checkpoint_base)
            for m in members}


def _train_nodes(m: RunningMember) -> tuple[NodeRef, ...]:
    """Where its training state lives: every node of its training gang."""
    return m.gang.nodes() if m.gang is not None else (m.train_node,)


def _resume(m: RunningMember, names: str, train_lost: bool, base: Path | None) -> Resume:
    if m.state is MemberState.FAILED or (m.state is MemberState.DONE and not train_lost):
        return Resume(ResumeKind.ENDED)
    if m.state is MemberState.DONE:   # lost before weaved read its final weights
        return _carried(m, names, base, final=True) or Resume(ResumeKind.ENDED)
    train = m.train_node.name
    if not train_lost:
        return Resume(ResumeKind.WARM,
                      f"{names} lost (allocation vanished from Slurm); waiting for a new "
                      "allocation, then re-admitted from its checkpoint",
                      readmit=f"{names} lost; re-attached on a new allocation",
                      version=m.version if m.initialised else None)
    carried = _carried(m, names, base)
    if carried is not None:
        return carried
    if not m.initialised:   # nothing learned yet: a fresh join loses nothing
        return Resume(ResumeKind.FRESH,
                      f"its training node {train} was lost during its first phase "
                      "(allocation vanished from Slurm); waiting for a new allocation, "
                      "then started again from scratch",
                      note=f"its training node {train} was lost during its first phase; "
                           "restarted from scratch")
    return Resume(ResumeKind.FAILED,
                  f"its training node {train} was lost with its warm state, and no "
                  "checkpoint of it is on a shared file system (allocation vanished from "
                  "Slurm); not resumable")


def _carried(m: RunningMember, names: str, base: Path | None,
             final: bool = False) -> Resume | None:
    """Moved to the new training node from its newest checkpoint on the lost one's root
    (None: none in reach). ``final``: it had reached its last version, but the node went
    before weaved read its final weights; every last step is checkpointed, so it ends
    again on the new node, where they are read."""
    carry = carried_checkpoint(m, base)
    if carry is None:
        return None
    root, version = carry
    lost, which = ((" before its final weights were read", "final") if final
                   else ("", "last"))
    state = "" if final else ", with its training state"
    return Resume(ResumeKind.CARRIED,
                  f"{names} lost (allocation vanished from Slurm){lost}{state}; waiting for "
                  f"a new allocation, then re-admitted there from its {which} checkpoint "
                  f"(v{version}, {root})",
                  readmit=f"{names} lost{lost}; re-admitted on a new training node from its "
                          f"{which} checkpoint (v{version})",
                  root=root, version=version, rank_roots=_rank_roots(m, root))


def handoff_resume(m: RunningMember, base: Path | None, source: str) -> Resume:
    """How a member a re-plan moves out of ``source`` (words: "group 3") goes on in its
    new group: from its newest checkpoint under its training node's root, which the new
    training node adopts (``CARRIED``); nothing learned yet: afresh (``FRESH``)."""
    if not m.initialised:
        return Resume(ResumeKind.FRESH, f"moving from {source} (a re-plan) before its "
                                        "first step; it starts there")
    carry = carried_checkpoint(m, base)
    if carry is None:
        return Resume(ResumeKind.FAILED,
                      f"a re-plan moved it from {source}, but no checkpoint of it is under "
                      f"its training node's root on a shared file system "
                      f"({base / m.train_node.slurm_host if base else 'none configured'}); "
                      "not resumable")
    root, version = carry
    return moved_with(source, root, version, _rank_roots(m, root))


def moved_with(source: str, root: Path, version: int,
               rank_roots: tuple[Path, ...] = ()) -> Resume:
    """A member a re-plan moves out of ``source`` with its checkpoint ``version`` under
    ``root`` (its training node's; ``rank_roots``: its other ranks')."""
    return Resume(ResumeKind.CARRIED,
                  f"moving from {source} (a re-plan) with its checkpoint v{version}; "
                  "re-admitted in its new group once that adopts it",
                  readmit=f"moved from {source} by a re-plan", root=root, version=version,
                  rank_roots=rank_roots)


def _rank_roots(m: RunningMember, root: Path) -> tuple[Path, ...]:
    """The checkpoint roots of its training gang's ranks 1.., beside rank 0's ``root``."""
    return tuple(root.parent / s.node.slurm_host for s in m.gang.others) if m.gang else ()


def carried_checkpoint(m: RunningMember, base: Path | None) -> tuple[Path, int] | None:
    """(checkpoint root, version) of the member's newest checkpoint on its lost
    training node, when weaved can see that node's root (None: no such checkpoint)."""
    if base is None:
        return None
    root = base / m.train_node.slurm_host
    version = checkpoint_version(root, m.job)
    return (root, version) if version is not None else None


def forget_checkpoints(m: RunningMember, base: Path | None,
                       nodes: Sequence[NodeRef]) -> list[Path]:
    """Remove ``m``'s checkpoints from the roots of ``nodes`` (its training nodes that
    could not drop them) on the file system weaved shares with the nodes (``base``;
    None: none, nothing removed); the roots it removed some from."""
    from weave_slurm.node.checkpoint import CheckpointStore

    if base is None:
        return []
    done = []
    for node in nodes:
        root = base / node.slurm_host
        try:
            store = CheckpointStore(root)
            if store.job_dir(m.job).is_dir():
                store.delete_job(m.job)
                done.append(root)
        except (WeaveError, OSError) as exc:
            m.warn(f"its checkpoints under {root} could not be removed: {exc}")
    return done


def checkpoint_version(root: Path, job: JobRef) -> int | None:
    """The version of ``job``'s newest checkpoint under the node checkpoint root
    ``root`` (None: none readable there)."""
    from weave_slurm.node.checkpoint import CheckpointStore

    try:
        store = CheckpointStore(root)
        info = store.read(store.latest(job))
    except (WeaveError, OSError):
        return None
    return info.versions.get(contract.STATE)
