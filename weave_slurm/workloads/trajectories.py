"""What a rollout produces: :class:`Trajectories` (tensors and metrics), tagged with
its job and weight version as a :class:`TrajectoryBatch`, and
:func:`concat_trajectories`, the default merge of a gang's engine slices (no torch at
import). Part of the job API (:mod:`weave_slurm.workloads.api` re-exports the types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from weave_slurm.errors import StateError

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Trajectories:
    """What a job's ``generate`` returns: tensors plus scalar metrics (e.g. mean reward)."""

    tensors: Mapping[str, Tensor]
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TrajectoryBatch:
    """A rollout tagged with the job and the weight version that produced it."""

    job_id: str
    weights_version: int
    trajectories: Trajectories

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.trajectories.metrics


def concat_trajectories(parts: Sequence[Trajectories]) -> Trajectories:
    """The engines' rollout slices as one batch, in rank order (the default merge).

    Every tensor is per row: concatenated on dim 0, its other dims zero-padded to the
    widest part (variable-length responses). A metric becomes the row-weighted mean of
    the parts' values (right for means; a job with other metrics, maxima say, implements
    ``merge_trajectories``).
    """
    if not parts:
        raise StateError("concat_trajectories: no parts")
    keys = list(parts[0].tensors)
    if any(list(p.tensors) != keys for p in parts):
        raise StateError("concat_trajectories: the parts hold different tensors "
                         f"({[sorted(p.tensors) for p in parts]})")
    tensors = {k: _cat_padded([p.tensors[k] for p in parts]) for k in keys}
    rows = [_rows(p) for p in parts]
    weights = rows if sum(rows) else [1] * len(parts)   # no tensors: a plain mean
    # a part of no rows (an engine with no share) says nothing, not even a NaN mean
    weighed = [(p, w) for p, w in zip(parts, weights, strict=True) if w]
    names = weighed[0][0].metrics if weighed else {}
    metrics = {m: sum(p.metrics[m] * w for p, w in weighed) / sum(weights)
               for m in names if all(m in p.metrics for p, _ in weighed)}
    return Trajectories(tensors, metrics)


def _rows(part: Trajectories) -> int:
    sizes = {int(t.shape[0]) for t in part.tensors.values()}
    if len(sizes) > 1:
        raise StateError(f"concat_trajectories: a part's tensors have {sorted(sizes)} rows; "
                         "every tensor must be per row")
    return sizes.pop() if sizes else 0


def _cat_padded(tensors: list[Tensor]) -> Tensor:
    import torch

    ndim = tensors[0].dim()
    if ndim == 0 or any(t.dim() != ndim for t in tensors):
        raise StateError("concat_trajectories: tensors must be per row, of one rank")
    widest = [max(int(t.shape[d]) for t in tensors) for d in range(1, ndim)]
    padded = []
    for t in tensors:
        pad: list[int] = []
        for d in range(ndim - 1, 0, -1):  # F.pad lists the last dim first
            pad += [0, widest[d - 1] - int(t.shape[d])]
        padded.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
    return torch.cat(padded, dim=0)
