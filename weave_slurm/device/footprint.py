"""What a worker holds on its device: the figures GPU memory admission plans with.

Per GPU, a member that is switched out still holds its CUDA context, NCCL's buffers
and whatever the caching allocator keeps; the member that runs holds its peak. A
worker measures both on a CUDA device: the allocator's ``memory_reserved`` and its
peak since the phase began and, where NVML answers (``pynvml``), the bytes the driver
accounts to this process (context and NCCL included). ``mem_get_info`` counts every
process on the GPU, so it cannot give one member's figure. On a CPU device there is
nothing to measure (``None``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from weave_slurm.device.hostmem import is_cuda


@dataclass(frozen=True)
class Footprint:
    """One device's figures for this process, in bytes."""

    reserved_bytes: int
    peak_reserved_bytes: int
    process_bytes: int | None     # NVML: everything the driver accounts to this pid

    @property
    def held_bytes(self) -> int:
        """The best figure of what this process holds: NVML's, else the allocator's."""
        return self.process_bytes if self.process_bytes is not None else self.reserved_bytes


def _initialized() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _index(device: str) -> int:
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def measure(device: str) -> Footprint | None:
    """This process's figures on ``device``; None on a CPU device or before CUDA is
    initialised (measuring must not create a context)."""
    if not is_cuda(device) or not _initialized():
        return None
    i = _index(device)
    return Footprint(torch.cuda.memory_reserved(i), torch.cuda.max_memory_reserved(i),
                     nvml_process_bytes(i))


def reset_peak(device: str) -> None:
    if is_cuda(device) and _initialized():
        torch.cuda.reset_peak_memory_stats(_index(device))


def nvml_process_bytes(index: int) -> int | None:
    """The driver's figure for this pid on GPU ``index`` (None without pynvml)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    with contextlib.suppress(Exception):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    return None
