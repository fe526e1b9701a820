"""The flat byte layout of a model's weights, as the sync moves them.

Every tensor gets an ``ALIGN_BYTES``-aligned range of one flat ``uint8`` buffer, so a
shard boundary never splits an element and the delta encoder can compare whole words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from weave_slurm.errors import ConfigError
from weave_slurm.sync.topology import ALIGN_BYTES


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lives in the flat buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightLayout:
    """Named tensors laid out in one flat byte buffer."""

    slots: tuple[TensorSlot, ...]
    total_nbytes: int

    @property
    def word_bytes(self) -> int:
        """Smallest element size: the delta encoder's comparison unit."""
        return min((s.dtype.itemsize for s in self.slots), default=1)

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> WeightLayout:
        slots: list[TensorSlot] = []
        offset = 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            slots.append(TensorSlot(name, t.dtype, tuple(t.shape), offset, nbytes))
            offset += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
        return cls(tuple(slots), offset)

    def flatten(self, tensors: Mapping[str, torch.Tensor], out: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Copy ``tensors`` into ``out`` (or a new zeroed buffer) and return it."""
        if out is None:
            out = torch.zeros(self.total_nbytes, dtype=torch.uint8)
        for slot in self.slots:
            if slot.name not in tensors:
                raise ConfigError(f"weights: tensor {slot.name!r} missing from the state dict")
            src = tensors[slot.name].detach().contiguous()
            if src.dtype != slot.dtype or tuple(src.shape) != slot.shape:
                raise ConfigError(
                    f"weights: tensor {slot.name!r} is {src.dtype}{list(src.shape)}, layout "
                    f"expects {slot.dtype}{list(slot.shape)}")
            out[slot.offset:slot.offset + slot.nbytes].copy_(
                src.reshape(-1).view(torch.uint8).to(out.device))
        return out

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Zero-copy typed views of ``flat`` (a buffer laid out by this layout)."""
        if flat.numel() < self.total_nbytes:
            raise ConfigError(
                f"flat buffer has {flat.numel()} bytes, layout needs {self.total_nbytes}")
        return {s.name: flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)
                for s in self.slots}
