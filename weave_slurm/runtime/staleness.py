"""Bounded-staleness members in the group runtime: weight buffers and the version log.

A member with window ``k >= 1`` (``MemberSpec.staleness``) overlaps its own rollout
and training: the rollout of step ``m`` uses **exactly** the weights of version
``max(0, m - k)`` (:func:`~weave_slurm.hosted.contract.rollout_version`), so it may
start as soon as that version is on its rollout node, without waiting for training
step ``m - 1``; training step ``v`` (held version ``v``) consumes the batch of step
``v``, so every batch's version ``b`` satisfies ``v - k <= b <= v``.

Weights travel into a ring of ``k + 1`` buffers per node (two for ``k = 1``: double
buffering), version ``v`` into buffer ``v % (k + 1)``. The runner writes the next
version into a buffer no rollout is reading (the ring argument: when version ``v``
exists, training ``v - 1`` has consumed the batch of the only rollout that used
version ``v - 1 - k``), each write replaces the segment file atomically (tmp file,
rename, index last) with the source's CRC32 in its index, and the runner checks the
written bytes against it before it *commits* the buffer (the flip: only then does a
rollout get pointed at it, by buffer name and version). The rollout phase checks the
version and the CRC32 again before it installs the weights. A half-written version is
never installed.

Every batch is recorded (:class:`BatchRecord`): its step, the weights version it was
generated with, the newest version that existed when its rollout started, and the
training step that consumed it. :class:`VersionLog` keeps them per member and rewrites
``<records_dir>/<job>.versions.jsonl`` after every change.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from weave_slurm.errors import StateError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class BatchRecord:
    """One trajectory batch of a member, from its rollout to the training that used it."""

    step: int                      # the rollout step m (= the training step meant to use it)
    weights_version: int           # the version it was generated with: max(0, m - k)
    newest_version: int            # the newest version trained when its rollout started
    consumed_at: int | None = None  # the held version v of the training that consumed it

    def in_window(self, staleness: int) -> bool:
        """``v - k <= b <= v`` and ``b`` no newer than existed at rollout start."""
        if self.consumed_at is None:
            return self.weights_version <= self.newest_version
        return (self.consumed_at - staleness <= self.weights_version <= self.consumed_at
                and self.weights_version <= self.newest_version)


class VersionLog:
    """The trajectory-version log of one member (persisted when ``path`` is set)."""

    def __init__(self, job_id: str, staleness: int, path: Path | None = None) -> None:
        self.job_id = job_id
        self.staleness = staleness
        self.path = path
        self.records: list[BatchRecord] = []

    def produced(self, step: int, weights_version: int, newest_version: int) -> None:
        self.records = [r for r in self.records if r.step < step]
        self.records.append(BatchRecord(step, weights_version, newest_version))
        self._save()

    def consumed(self, step: int, at_version: int) -> BatchRecord:
        for i, rec in enumerate(self.records):
            if rec.step == step and rec.consumed_at is None:
                done = replace(rec, consumed_at=at_version)
                if not done.in_window(self.staleness):
                    raise StateError(f"member {self.job_id}: batch of step {step} from "
                                     f"weights v{rec.weights_version} trained at "
                                     f"v{at_version}: outside the window k={self.staleness}")
                self.records[i] = done
                self._save()
                return done
        raise StateError(f"member {self.job_id}: no unconsumed batch of step {step} in its "
                         f"version log (steps {[r.step for r in self.records]})")

    def rewind(self, version: int) -> None:
        """A restore to ``version``: batches of later steps are replayed."""
        self.records = [r for r in self.records if r.step < version]
        self._save()

    def current_staleness(self) -> int | None:
        """Version lag of the last consumed batch (None before the first)."""
        lags = [r.consumed_at - r.weights_version for r in self.records
                if r.consumed_at is not None]
        return lags[-1] if lags else None

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = [json.dumps({"job": self.job_id, "staleness": self.staleness, **asdict(r)})
                 for r in self.records]
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.path)

    @staticmethod
    def load(path: Path) -> list[BatchRecord]:
        """Read a persisted log back (tests, tools)."""
        out = []
        for line in path.read_text().splitlines():
            raw = json.loads(line)
            out.append(BatchRecord(int(raw["step"]), int(raw["weights_version"]),
                                   int(raw["newest_version"]), raw["consumed_at"]))
        return out
