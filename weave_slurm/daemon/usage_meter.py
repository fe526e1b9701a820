"""Usage records, booked as the groups run: each member's share of its group's allocations
and its time in each phase (docs/accounting.md).

:class:`UsageMeter` is one act of the reconcile loop (:meth:`UsageMeter.advance`, every
tick). For each group not yet booked to its end it books the window since its mark:

- **allocations** from the store's own history: an allocation is held from its
  transition to HELD until its transition out of it (RELEASING or LOST), a member is
  in its group from its transition to PLACED until it ended; the window is split by
  :func:`~weave_slurm.model.usage.split_usage` (equal shares among the members present),
  so a weaved that was down books the time it missed at its next tick (Slurm kept the
  allocations meanwhile) and no second is booked twice;
- **phases** from the group runtime's timeline (``spans``, when the driver keeps one):
  the union of each member's spans of each phase that ended since the last tick
  (a phase on two nodes at once counts once).

The increments and the new marks are written in one transaction (``Store.book_usage``),
so the records are current to the last tick and survive a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from weave_slurm.daemon.records import GroupRow, JobRow, UsageMark, UsageRow
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.cost import CostRates
from weave_slurm.model.usage import Held, Membership, Share, split_usage
from weave_slurm.runtime.timeline import Span
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)


@runtime_checkable
class SpanSource(Protocol):
    """A driver that keeps a timeline: group id -> the spans its runner recorded (a
    list that only grows; a rebuilt runner starts a new one)."""

    spans: Mapping[int, list[Span]]


class UsageMeter:
    """Books usage window by window (module doc)."""

    def __init__(self, store: Store, rates: CostRates, driver: object = None) -> None:
        self.store, self.rates = store, rates
        self.source = driver if isinstance(driver, SpanSource) else None
        self._cursors: dict[int, tuple[list[Span], int]] = {}   # id(list) -> (list, read)
        self._covered: dict[tuple[int, str], float] = {}   # (job, phase) -> counted until
        self._placed: dict[int, float] = {}   # job -> when it was placed (immutable)
        self._spans: dict[int, tuple[float, float | None]] = {}   # alloc key -> held

    def advance(self, now: float) -> None:
        """Book every open group's window up to ``now`` and the phases that ended."""
        marks = self.store.usage_marks()
        rows: dict[int, _Acc] = {}
        new_marks = []
        for group in self.store.groups(live_only=False):
            mark = marks.get(group.group_id)
            if mark is not None and mark.closed:
                continue
            start = mark.until_s if mark is not None else group.created_s
            if now <= start:
                continue
            split = split_usage(self._held(group, now), self._members(
                self.store.jobs(group_id=group.group_id), now), start, now, self.rates)
            for job_id, share in split.members.items():
                rows.setdefault(job_id, _Acc(group.group_id)).share = share
            new_marks.append(_next_mark(group, mark, now, split.unattributed))
        for (job_id, phase), seconds in self._phase_increments().items():
            found = self.store.job(job_id) if job_id not in rows else None
            acc = rows.setdefault(job_id, _Acc(found.group_id if found else None))
            acc.phase_s[phase] = acc.phase_s.get(phase, 0.0) + seconds
        if rows or new_marks:
            self.store.book_usage([a.row(job_id, now) for job_id, a in rows.items()],
                                  new_marks)

    # -- allocations and members ---------------------------------------------------------

    def _held(self, group: GroupRow, now: float) -> list[Held]:
        """Each allocation of the group over the time it was held (its transitions: an
        allocation is HELD once at most; what a row says once it is no longer held, or
        since when it is held, never changes, so it is read once); a node it gave back
        to Slurm (a shrink: ``AllocRow.gone_s``) until it was given back."""
        out = []
        for alloc in self.store.allocs(group.group_id, live_only=False):
            if alloc.alloc_id is None:
                continue
            span = self._spans.get(alloc.key)
            if span is None or (span[1] is None and alloc.state is not AllocState.HELD):
                span = self._held_span(alloc.key)
                if span is None:
                    continue
                self._spans[alloc.key] = span
            start, end = span[0], now if span[1] is None else span[1]
            out.append(Held(alloc.alloc_id, Pool(alloc.role), alloc.held_count,
                            alloc.gpus_per_node, start, end))
            out += [Held(alloc.alloc_id, Pool(alloc.role), 1, alloc.gpus_per_node, start,
                         max(start, min(at, end))) for at in alloc.gone_s]   # given back
        return out

    def _held_span(self, key: int) -> tuple[float, float | None] | None:
        """(held since, held until or None: still held) from an allocation's history."""
        start: float | None = None
        for t in self.store.transitions("alloc", key):
            if t.dst == AllocState.HELD.value:
                start = t.ts
            elif t.src == AllocState.HELD.value and start is not None:
                return start, t.ts
        return None if start is None else (start, None)

    def _members(self, jobs: Sequence[JobRow], now: float) -> list[Membership]:
        """Each job of the group from its placement until it ended (or ``now``)."""
        out = []
        for job in jobs:
            placed = self._placed_s(job)
            if placed is not None:
                end = job.ended_s if job.state.final and job.ended_s is not None else now
                out.append(Membership(job.job_id, placed, max(placed, end)))
        return out

    def _placed_s(self, job: JobRow) -> float | None:
        if job.job_id not in self._placed:
            ts = next((t.ts for t in self.store.transitions("job", job.job_id)
                       if t.dst == JobState.PLACED.value), None)
            if ts is None:
                return None
            self._placed[job.job_id] = ts
        return self._placed[job.job_id]

    # -- phases ------------------------------------------------------------------------

    def _new_spans(self) -> list[Span]:
        """The spans recorded since the last call, over every runner list seen (a list
        replaced by a rebuilt runner is read to its end, then let go)."""
        if self.source is None:
            return []
        current = {id(spans): spans for spans in list(self.source.spans.values())}
        for key, spans in current.items():
            self._cursors.setdefault(key, (spans, 0))
        out: list[Span] = []
        for key, (spans, read) in list(self._cursors.items()):
            end = len(spans)
            out += spans[read:end]
            if key in current:
                self._cursors[key] = (spans, end)
            else:
                del self._cursors[key]
        return out

    def _phase_increments(self) -> dict[tuple[int, str], float]:
        """Seconds per (job, phase) the new spans add to what was counted: their union
        (overlapping spans of one phase on several nodes count once), less what earlier
        spans of that phase already covered (a member's phases of one kind follow each
        other, so that is everything up to the last one's end)."""
        by_key: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for span in self._new_spans():
            if span.job_id.isdigit() and span.end_s > span.start_s:
                by_key.setdefault((int(span.job_id), span.kind.value), []).append(
                    (span.start_s, span.end_s))
        out: dict[tuple[int, str], float] = {}
        for key, intervals in by_key.items():
            covered = self._covered.get(key, float("-inf"))
            total = 0.0
            for start, end in _merged(intervals):
                total += max(0.0, end - max(start, covered))
                covered = max(covered, end)
            self._covered[key] = covered
            if total > 0:
                out[key] = total
        return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as disjoint intervals in time order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class _Acc:
    """One job's increments of one booking."""

    def __init__(self, group_id: int | None) -> None:
        self.group_id = group_id
        self.share = Share()
        self.phase_s: dict[str, float] = {}

    def row(self, job_id: int, now: float) -> UsageRow:
        s = self.share
        return UsageRow(job_id, self.group_id, {p.value: v for p, v in s.gpu_s.items()},
                        {p.value: v for p, v in s.node_s.items()}, dict(self.phase_s), s.cost,
                        tuple(sorted(s.alloc_ids)), now)


def _next_mark(group: GroupRow, mark: UsageMark | None, now: float,
               idle: Share) -> UsageMark:
    """The group booked to ``now``; closed once it is released (nothing more to hold)."""
    before = mark.idle_gpu_s if mark is not None else {}
    return UsageMark(group.group_id, now, group.state is GroupState.RELEASED,
                     {p.value: before.get(p.value, 0.0) + idle.gpu_s[p] for p in Pool},
                     (mark.idle_cost if mark is not None else 0.0) + idle.cost)
