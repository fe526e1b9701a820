"""The gang side of the job API: how a role's ranks share work, state and weights.

A role may run as a *gang* (docs/job_api.md, "Gangs"): training as ``world_size``
ranks of one torch.distributed world (one rank per GPU), rollout as ``world_size``
engines. The runtime forms the world; a job reads its place in it from its
:class:`~weave_slurm.workloads.api.JobContext`. This module holds what both sides of
that contract share, with no torch at import:

- :func:`share_bounds`: a rank's balanced, contiguous share of ``n`` items (an
  engine's prompts, a training rank's rows of a minibatch);
- :func:`chunk_bounds`: the rows of a dim-0 shard as ``torch.chunk`` and FSDP2 cut them;
- :class:`WeightShard`: what ``export_weight_shard`` returns (a rank's weights as one
  flat tensor plus where each piece belongs), and :func:`assemble_weights`, its inverse
  over the whole gang, for a sharded weight sync.

The default merge of the engines' rollout slices is
:func:`weave_slurm.workloads.trajectories.concat_trajectories`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weave_slurm.errors import StateError

if TYPE_CHECKING:
    from torch import Tensor

_SHARD_PREFIX = "weave.shard."


def share_bounds(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s items ``[lo, hi)`` of ``n``: contiguous, sizes differ by at most 1,
    the larger shares first (``numpy.array_split``)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a gang of {world_size}")
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def chunk_bounds(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[lo, hi)`` of a tensor of ``n`` rows sharded on dim 0 the
    way ``torch.chunk`` and FSDP2 cut it: ``ceil(n / world_size)`` rows each, the last
    ranks possibly short or empty."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a gang of {world_size}")
    size = -(-n // world_size)
    return min(n, rank * size), min(n, (rank + 1) * size)


@dataclass(frozen=True)
class ShardPiece:
    """Where one weight's elements held by a rank belong.

    The full tensor ``name`` of shape ``shape``, flattened, has elements
    ``[start, start + numel)`` in ``WeightShard.flat[offset:offset + numel]``.
    """

    name: str
    shape: tuple[int, ...]
    start: int
    offset: int
    numel: int


@dataclass(frozen=True)
class WeightShard:
    """One rank's share of the policy weights (``export_weight_shard``).

    ``flat`` is 1-D, one dtype: the rank's elements of every weight, concatenated in
    ``pieces`` order. Every rank lists every weight (``numel`` 0 where it holds none),
    so the shards of ranks ``0..world_size-1`` cover each weight exactly once.
    """

    rank: int
    world_size: int
    flat: Tensor
    pieces: tuple[ShardPiece, ...]

    def to_tensors(self) -> dict[str, Tensor]:
        """A flat tensor dict (what a node's shared-memory store holds): the flat shard,
        the gang, and per weight ``[start, offset, numel, *shape]`` (int64)."""
        import torch

        out = {f"{_SHARD_PREFIX}flat": self.flat,
               f"{_SHARD_PREFIX}gang": torch.tensor([self.rank, self.world_size])}
        for p in self.pieces:
            out[f"{_SHARD_PREFIX}piece.{p.name}"] = torch.tensor(
                [p.start, p.offset, p.numel, *p.shape], dtype=torch.int64)
        return out

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> WeightShard:
        """The inverse of :meth:`to_tensors`."""
        try:
            flat, gang = tensors[f"{_SHARD_PREFIX}flat"], tensors[f"{_SHARD_PREFIX}gang"]
        except KeyError as exc:
            raise StateError(f"weight shard: missing {exc.args[0]!r}") from None
        head = f"{_SHARD_PREFIX}piece."
        pieces = []
        for key, t in tensors.items():
            if key.startswith(head):
                start, offset, numel, *shape = (int(v) for v in t.tolist())
                pieces.append(ShardPiece(key[len(head):], tuple(shape), start, offset, numel))
        pieces.sort(key=lambda p: p.offset)
        rank, world = (int(v) for v in gang.tolist())
        return cls(rank, world, flat, tuple(pieces))


def pack_shard(rank: int, world_size: int,
               parts: Iterable[tuple[str, tuple[int, ...], int, Tensor]]) -> WeightShard:
    """A :class:`WeightShard` from ``(name, full shape, first element, local elements)``
    per weight (the local tensor is flattened; the flat shard is a copy)."""
    import torch

    pieces, flats, at = [], [], 0
    for name, shape, start, local in parts:
        flat = local.detach().reshape(-1)
        pieces.append(ShardPiece(name, shape, start, at, flat.numel()))
        flats.append(flat)
        at += flat.numel()
    dtypes = sorted({str(f.dtype) for f in flats})
    if len(dtypes) > 1:
        raise StateError(f"weight shard: a flat shard holds one dtype, the weights have "
                         f"{dtypes}")
    return WeightShard(rank, world_size, torch.cat(flats), tuple(pieces))


def whole_shard(weights: Mapping[str, Tensor]) -> WeightShard:
    """All of ``weights`` as the one shard of a single rank."""
    return pack_shard(0, 1, ((name, tuple(int(d) for d in t.shape), 0, t)
                             for name, t in weights.items()))


def assemble_weights(shards: Sequence[WeightShard]) -> dict[str, Tensor]:
    """The full weights from the shards of every rank of a gang (in any order).

    Refuses (``StateError``) shards of different gangs, a missing or repeated rank, and
    a weight whose pieces leave a gap or overlap.
    """
    import torch

    if not shards:
        raise StateError("assemble_weights: no shards")
    world = shards[0].world_size
    ranks = sorted(s.rank for s in shards)
    if any(s.world_size != world for s in shards) or ranks != list(range(world)):
        raise StateError(f"assemble_weights: need one shard of each rank 0..{world - 1}, got "
                         f"ranks {ranks} of gangs {sorted({s.world_size for s in shards})}")
    first = min(shards, key=lambda s: s.rank)
    out: dict[str, Tensor] = {}
    for name, shape in ((p.name, p.shape) for p in first.pieces):
        full = torch.empty(math.prod(shape), dtype=first.flat.dtype)
        spans = []
        for shard in shards:
            for p in (p for p in shard.pieces if p.name == name and p.numel):
                full[p.start:p.start + p.numel] = shard.flat[p.offset:p.offset + p.numel]
                spans.append((p.start, p.start + p.numel))
        _check_cover(name, sorted(spans), full.numel())
        out[name] = full.view(shape)
    return out


def _check_cover(name: str, spans: list[tuple[int, int]], numel: int) -> None:
    end = 0
    for lo, hi in spans:
        if lo != end:
            raise StateError(f"assemble_weights: {name}: elements {min(lo, end)}..{max(lo, end)}"
                             f" {'overlap' if lo < end else 'are missing'}")
        end = hi
    if end != numel:
        raise StateError(f"assemble_weights: {name}: elements {end}..{numel} are missing")
