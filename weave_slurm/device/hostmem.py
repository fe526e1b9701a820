"""Host memory that a GPU copies to and from at full DMA rate.

A copy between a GPU and *pageable* host memory goes through a driver bounce buffer
at a fraction of the link's rate; a copy to *page-locked* memory runs as one DMA. The
node's shared-memory segments are ordinary tmpfs pages, so a worker registers the
mapping of a segment it copies into or out of with ``cudaHostRegister``
(:class:`HostRegistry`, kept for the mapping's life: pinning a range costs time per
page once, not per switch). Where registration fails (a limit on locked memory, a
driver that refuses shared mappings), :class:`Copier` copies through a small pinned
staging buffer, chunk by chunk.

On a CPU device every copy is a plain ``copy_``: the code paths above are the same
and only the CUDA calls are skipped, so CPU tests exercise everything but the DMA.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

#: Bytes of the pinned staging buffer used when a host range cannot be registered.
STAGING_BYTES = 64 << 20
_REGISTER_DEFAULT = 0          # cudaHostRegisterDefault


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _rc(value: object) -> int:
    """A cudaError_t as torch's cudart binding returns it (an enum or an int)."""
    raw: Any = getattr(value, "value", value)
    return int(raw)


@dataclass
class _Range:
    storage: torch.UntypedStorage     # kept alive while registered
    nbytes: int


class HostRegistry:
    """Host ranges registered with CUDA (page-locked) by this process.

    ``register`` is idempotent per mapping and returns whether the range is now
    page-locked (always False without CUDA). The registry holds a reference to every
    registered storage, so a mapping is never unmapped while CUDA has it pinned;
    ``unregister`` (or ``close``) releases it.
    """

    def __init__(self) -> None:
        self._ranges: dict[int, _Range] = {}
        self.failures = 0

    @property
    def registered_bytes(self) -> int:
        return sum(r.nbytes for r in self._ranges.values())

    def register(self, storage: torch.UntypedStorage) -> bool:
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self._ranges:
            return True
        if nbytes == 0 or not torch.cuda.is_available():
            return False
        rc = _rc(_cudart().cudaHostRegister(ptr, nbytes, _REGISTER_DEFAULT))
        if rc != 0:
            self.failures += 1
            log.warning("cudaHostRegister of %d B failed (cudaError %d): copies of this "
                        "range go through a pinned staging buffer", nbytes, rc)
            return False
        self._ranges[ptr] = _Range(storage, nbytes)
        return True

    def unregister(self, storage: torch.UntypedStorage) -> None:
        r = self._ranges.pop(storage.data_ptr(), None)
        if r is not None and torch.cuda.is_available():
            rc = _rc(_cudart().cudaHostUnregister(r.storage.data_ptr()))
            if rc != 0:
                log.warning("cudaHostUnregister of %d B failed (cudaError %d)", r.nbytes, rc)

    def close(self) -> None:
        for r in list(self._ranges.values()):
            self.unregister(r.storage)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (no copy)."""
    if not t.is_contiguous():
        raise ValueError(f"tensor of shape {tuple(t.shape)} is not contiguous")
    return t.reshape(-1).view(torch.uint8)


class Copier:
    """Copies tensors between a device and host views of shared memory.

    ``pinned`` says the host side is page-locked (registered or pinned): the copies
    are then issued asynchronously on the current stream and synchronised once at the
    end. Otherwise each tensor goes through the staging buffer in chunks of
    :data:`STAGING_BYTES` (allocated on first use, kept for the copier's life).
    """

    def __init__(self, device: str | torch.device,
                 staging_bytes: int = STAGING_BYTES) -> None:
        self.device = torch.device(device)
        self._staging_bytes = staging_bytes
        self._staging: torch.Tensor | None = None

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host memory this copier holds (its staging buffer)."""
        return 0 if self._staging is None else self._staging.numel()

    def _buffer(self) -> torch.Tensor:
        if self._staging is None:
            self._staging = torch.empty(self._staging_bytes, dtype=torch.uint8,
                                        pin_memory=True)
        return self._staging

    def copy(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
             pinned: bool) -> int:
        """``dst.copy_(src)`` for every pair (one side on the device, one on the host);
        returns the bytes copied."""
        total = 0
        cuda = is_cuda(self.device)
        for src, dst in pairs:
            n = src.numel() * src.element_size()
            total += n
            if not (src.is_cuda or dst.is_cuda):     # host to host
                dst.copy_(src)
            elif not cuda or pinned or n == 0:
                dst.copy_(src, non_blocking=cuda)
            else:
                self._staged(src, dst, n)
        if cuda:
            torch.cuda.synchronize(self.device)
        return total

    def _staged(self, src: torch.Tensor, dst: torch.Tensor, n: int) -> None:
        buf = self._buffer()
        s, d = _flat(src), _flat(dst)
        for lo in range(0, n, buf.numel()):
            k = min(buf.numel(), n - lo)
            buf[:k].copy_(s[lo:lo + k], non_blocking=True)
            if s.is_cuda:                   # device -> staging must land first
                torch.cuda.synchronize(self.device)
            d[lo:lo + k].copy_(buf[:k], non_blocking=True)
            torch.cuda.synchronize(self.device)


def fill_host(storage: torch.UntypedStorage,
              pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy ``(src, view)`` pairs into views of the mapped ``storage`` (a staged
    segment): device tensors at full DMA rate through a registration held for the
    copy, host tensors by plain copies."""
    pairs = list(pairs)
    device = next((src.device for src, _ in pairs if src.is_cuda), None)
    if device is None:
        for src, dst in pairs:
            dst.copy_(src)
        return
    registry = HostRegistry()
    pinned = registry.register(storage)
    try:
        Copier(device).copy(pairs, pinned=pinned)
    finally:
        registry.unregister(storage)
