"""Moving a member's device state into its node's shared memory and back.

A warm switch keeps a member's Python objects (modules, optimizer, engine) in its
resident worker and moves only the *bytes* off the device:

- **out**: every tensor the job names (:class:`~weave_slurm.device.protocols.SwitchesDevice`:
  parameters, gradients, buffers, optimizer moments) is copied into a host view (a
  mapped, page-locked shared-memory segment), then its ``.data`` is swapped for an
  empty tensor on the same device, so the device memory goes back to the allocator
  (and with ``torch.cuda.empty_cache`` to the driver). The tensor *objects* stay: the
  optimizer's state, hooks and parameter identities are untouched.
- **in**: each tensor gets fresh device memory of its old shape and dtype, the bytes
  are copied back, and its ``.data`` points there again: bit for bit what it was.

A job that frees its device memory by its own means
(:class:`~weave_slurm.device.protocols.OffloadsDevice`: DeepSpeed's ``offload_states``,
vLLM's ``sleep``/``wake_up``) is switched through those calls instead.

:class:`SwitchMode` decides whether switches happen at all: ``auto`` only for a CUDA
device (on a CPU device the "device" memory already is host memory), ``on`` always
(the CPU tests), ``off`` never.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from weave_slurm.device.hostmem import Copier, HostRegistry, is_cuda
from weave_slurm.device.protocols import OffloadsDevice, SwitchesDevice
from weave_slurm.errors import StateError
from weave_slurm.vocab import member_of


class SwitchMode(enum.Enum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"

    @classmethod
    def parse(cls, value: str) -> SwitchMode:
        return member_of(cls, value, "device_switch: unknown value {value} (valid: {choices})")

    def applies(self, device: str) -> bool:
        return self is SwitchMode.ON or (self is SwitchMode.AUTO and is_cuda(device))


@dataclass(frozen=True)
class SwitchReport:
    """What one switch moved: bytes, seconds, whether the host side was page-locked,
    and what the job holds afterwards (device bytes of its tensors; host bytes its own
    offload keeps outside the node's segments)."""

    direction: str
    moved_bytes: int
    seconds: float
    pinned: bool
    held_bytes: int
    host_bytes: int = 0
    register_s: float = 0.0     # pinning the host side first (once per mapping)

    @property
    def gb_per_s(self) -> float:
        return self.moved_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "moved_bytes": self.moved_bytes,
                "seconds": round(self.seconds, 6), "pinned": self.pinned,
                "held_bytes": self.held_bytes, "host_bytes": self.host_bytes,
                "register_s": round(self.register_s, 6), "gb_per_s": round(self.gb_per_s, 3)}


def module_tensors(module: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """A module's parameters, their gradients and its buffers, by stable names."""
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        out[f"{prefix}.{name}"] = p
        if p.grad is not None:
            out[f"{prefix}.{name}.grad"] = p.grad
    for name, b in module.named_buffers():
        out[f"{prefix}.buf.{name}"] = b
    return out


def optimizer_tensors(optimizer: torch.optim.Optimizer, prefix: str) -> dict[str, torch.Tensor]:
    """An optimizer's state tensors, named by parameter position and key."""
    out: dict[str, torch.Tensor] = {}
    i = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    out[f"{prefix}.{i}.{key}"] = value
            i += 1
    return out


class DeviceSwitch:
    """The warm switch of one job instance (one role) in its resident worker."""

    def __init__(self, job: object, device: str, mode: SwitchMode,
                 registry: HostRegistry | None = None, copier: Copier | None = None) -> None:
        self.job = job
        self.device = device
        self.mode = mode
        self.registry = registry or HostRegistry()
        self.copier = copier or Copier(device)
        self._moved: list[tuple[str, torch.Tensor, torch.Size, torch.dtype]] = []
        self._own_out = False
        self.host_bytes = 0      # held by the job's own offload (pinned, outside shm)
        self._pinned: torch.UntypedStorage | None = None   # its registered host mapping

    @property
    def active(self) -> bool:
        return self.mode.applies(self.device) and isinstance(
            self.job, (SwitchesDevice, OffloadsDevice))

    @property
    def switched_out(self) -> bool:
        return bool(self._moved) or self._own_out

    @property
    def own(self) -> bool:
        """The job frees its device memory by its own means (OffloadsDevice)."""
        return isinstance(self.job, OffloadsDevice)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The job's device tensors, each once, all contiguous and on one device."""
        job = self.job
        if not isinstance(job, SwitchesDevice):
            return {}
        seen: dict[int, str] = {}
        out: dict[str, torch.Tensor] = {}
        storages: dict[int, str] = {}
        kind = torch.device(self.device).type
        for name, t in job.device_tensors().items():
            if id(t) in seen:            # a tied weight: one tensor, two names
                continue
            if t.numel() == 0 or t.device.type != kind:   # e.g. Adam's step on the host
                continue
            if not t.is_contiguous():
                raise StateError(f"device tensor {name!r} is not contiguous: a warm "
                                 "switch moves whole storages")
            ptr = t.untyped_storage().data_ptr()
            if ptr in storages:
                raise StateError(f"device tensors {storages[ptr]!r} and {name!r} share "
                                 "one storage; name the storage once (its owner tensor)")
            seen[id(t)], storages[ptr] = name, name
            out[name] = t
        return out

    def held_bytes(self) -> int:
        """Device bytes the job's tensors hold now (0 once switched out)."""
        if not self.active or self.switched_out:
            return 0
        if self.own:
            return 1      # unknown to us, but held: the daemon must switch it out
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def _pin(self, storage: torch.UntypedStorage | None) -> tuple[bool, float]:
        """Register the host side (CUDA devices only) and keep it registered; a new
        mapping (the segment was replaced) releases the old. Whether it is pinned, and
        the seconds that took (not counted in the copy's)."""
        if storage is None or not is_cuda(self.device):
            return False, 0.0
        if self._pinned is not None and self._pinned.data_ptr() != storage.data_ptr():
            self.release()
        start = time.perf_counter()
        pinned = self.registry.register(storage)
        self._pinned = storage if pinned else None
        return pinned, time.perf_counter() - start

    def release(self) -> None:
        """Unpin its host mapping (replaced, or the instance is gone)."""
        if self._pinned is not None:
            self.registry.unregister(self._pinned)
            self._pinned = None

    # -- out --------------------------------------------------------------------------
    def out(self, tensors: Mapping[str, torch.Tensor], views: Mapping[str, torch.Tensor],
            storage: torch.UntypedStorage | None, *, copied: bool = False) -> SwitchReport:
        """Copy ``tensors`` into ``views`` (skipped when ``copied``: the caller's put
        already wrote them) and free their device memory."""
        if self.switched_out:
            raise StateError("device switch: already switched out (switch it in first)")
        pinned, register_s = self._pin(storage)
        start = time.perf_counter()
        moved = 0
        if not copied:
            missing = sorted(set(tensors) - set(views))
            if missing:
                raise StateError(f"device switch: the segment lacks {missing[:3]}")
            moved = self.copier.copy(((t.detach(), views[k]) for k, t in tensors.items()),
                                     pinned=pinned)
        self._moved = [(k, t, t.shape, t.dtype) for k, t in tensors.items()]
        for _, t, _, dtype in self._moved:
            t.data = torch.empty(0, dtype=dtype, device=t.device)
        if is_cuda(self.device):
            torch.cuda.empty_cache()
        return SwitchReport("out", moved or _nbytes(tensors), time.perf_counter() - start,
                            pinned, 0, register_s=register_s)

    def out_own(self) -> SwitchReport:
        """The job's own offload (OffloadsDevice)."""
        if self.switched_out:
            raise StateError("device switch: already switched out (switch it in first)")
        start = time.perf_counter()
        job = self.job
        assert isinstance(job, OffloadsDevice)
        self.host_bytes = int(job.offload_device())
        self._own_out = True
        if is_cuda(self.device):
            torch.cuda.empty_cache()
        return SwitchReport("out", self.host_bytes, time.perf_counter() - start, True, 0,
                            self.host_bytes)

    # -- in ---------------------------------------------------------------------------
    def into(self, views: Mapping[str, torch.Tensor],
             storage: torch.UntypedStorage | None) -> SwitchReport:
        """Give every moved tensor device memory again and copy its bytes back."""
        pinned, register_s = self._pin(storage)
        start = time.perf_counter()
        missing = sorted({k for k, *_ in self._moved} - set(views))
        if missing:
            raise StateError(f"device switch: the segment lacks {missing[:3]}; the "
                             "switched-out state is gone (replace the worker)")
        fresh = [(t, torch.empty(shape, dtype=dtype, device=t.device), views[k])
                 for k, t, shape, dtype in self._moved]
        moved = self.copier.copy(((v, new) for _, new, v in fresh), pinned=pinned)
        for t, new, _ in fresh:
            t.data = new
        self._moved = []
        return SwitchReport("in", moved, time.perf_counter() - start, pinned,
                            self.held_bytes(), register_s=register_s)

    def into_own(self, weights: Mapping[str, torch.Tensor] | None) -> SwitchReport:
        start = time.perf_counter()
        job = self.job
        assert isinstance(job, OffloadsDevice)
        job.reload_device(weights)
        moved, self.host_bytes, self._own_out = self.host_bytes, 0, False
        return SwitchReport("in", moved, time.perf_counter() - start, True, 1)


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
