"""What a job offers the warm switch: the two optional job-side protocols.

A job implements one of them to let weave free its device memory while another member
runs on the node (docs/node.md, "Device switch"). Jobs import them from
:mod:`weave_slurm.workloads.api`, which re-exports them with the rest of the job API;
they live here so that the switch (:mod:`~weave_slurm.device.switch`) needs nothing of
``workloads``. Imports no torch at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor


@runtime_checkable
class SwitchesDevice(Protocol):
    """Optional: the tensors a job holds on its device, for the runtime's warm switch.

    ``device_tensors`` names every tensor whose bytes live on the device (parameters,
    their gradients, buffers, optimizer moments; :func:`~weave_slurm.device.switch.module_tensors`
    and :func:`~weave_slurm.device.switch.optimizer_tensors` build it), each contiguous
    and owning its storage. When another member needs the node's GPUs the runtime
    copies their bytes into the node's shared memory and swaps each tensor's ``.data``
    for an empty one; before the job's next phase it gives them device memory again
    and copies the bytes back (docs/node.md, "Device switch"). Names must be the same
    on every call while the job runs.
    """

    def device_tensors(self) -> dict[str, Tensor]: ...


@runtime_checkable
class OffloadsDevice(Protocol):
    """Optional: a job that frees and refills its device memory by its own means.

    ``offload_device`` frees it (DeepSpeed's ``engine.offload_states()``, vLLM's
    ``LLM.sleep(level=2)``) and returns the bytes of page-locked host memory it keeps
    meanwhile (charged to the node's budget); ``reload_device`` brings it back. A
    rollout gets the node's current ``weights`` segment (read-only shared memory) to
    load from, as vLLM's ``wake_up(tags=["weights"])`` then ``load_weights`` expects;
    a training job gets ``None``. Preferred over :class:`SwitchesDevice`.
    """

    def offload_device(self) -> int: ...

    def reload_device(self, weights: Mapping[str, Tensor] | None) -> None: ...


