"""The device switches of the job instances one resident worker keeps (docs/node.md,
"Device switch").

The worker's phase entries (:mod:`~weave_slurm.hosted.phases`) hand every job instance
they keep to :func:`track`, call :func:`switch_in` before the instance's next phase
and report :func:`held_bytes` and :func:`figures` in each phase's result. The node
daemon's tenancy (:mod:`~weave_slurm.node.tenancy`) runs the worker's switch-out entry,
which calls :func:`switch_out`, when another member's phase is about to start on the
node while this one still holds device memory; when the same member runs next nothing
moves.

Switch-out writes an instance's device tensors into its scratch segment on the node
(:class:`Scratch`: where it lives and how it is put is the caller's; hosted jobs use
``device.<role>``): created by an ordinary put the first time (or when the layout
changed, e.g. once Adam's moments exist), then written in place through the worker's
mapping, which stays registered with CUDA for the mapping's life. Only this worker
reads it back: a worker that is replaced rebuilds from its warm state.

An instance is keyed by its job id and role name. The state is this process's (one
resident worker serves one job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from weave_slurm.device import footprint
from weave_slurm.device.hostmem import Copier, HostRegistry
from weave_slurm.device.switch import DeviceSwitch, SwitchMode
from weave_slurm.errors import StateError


class Context(Protocol):
    """What the switch reads of a job instance's context (``JobContext``)."""

    @property
    def device(self) -> str: ...


class Instance(Protocol):
    """A job instance the worker keeps (``JobRunner``): the job and its context."""

    @property
    def job(self) -> object: ...

    @property
    def context(self) -> Context: ...


class Attached(Protocol):
    """A segment mapped into this worker (``AttachedState``)."""

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]: ...

    @property
    def storage(self) -> torch.UntypedStorage: ...


class Scratch(Protocol):
    """Where an instance's switched-out device state goes on the node: one scratch
    segment per role of the job."""

    def name(self, role: str) -> str:
        """The segment's name (for messages)."""
        ...

    def get(self, role: str) -> Attached | None:
        """The segment as this worker has it mapped; None if there is none."""
        ...

    def put(self, role: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write ``tensors`` as a new segment (an ordinary put)."""


_REGISTRY = HostRegistry()
_COPIERS: dict[str, Copier] = {}     # one staging buffer per device in this worker


@dataclass
class _Tracked:
    instance: Instance
    switch: DeviceSwitch
    resident: int | None = None     # device bytes it kept after its last switch-out


_TRACKED: dict[tuple[str, str], _Tracked] = {}


def track(job_id: str, role: str, instance: Instance, mode: str) -> DeviceSwitch:
    """The switch of ``instance`` (a new one when the instance was replaced)."""
    key = (job_id, role)
    held = _TRACKED.get(key)
    if held is None or held.instance is not instance:
        if held is not None:
            held.switch.release()
        device = instance.context.device
        copier = _COPIERS.setdefault(device, Copier(device))
        held = _TRACKED[key] = _Tracked(instance, DeviceSwitch(
            instance.job, device, SwitchMode.parse(mode), _REGISTRY, copier))
    else:
        held.switch.mode = SwitchMode.parse(mode)
    return held.switch


def forget(job_id: str, role: str) -> None:
    held = _TRACKED.pop((job_id, role), None)
    if held is not None:
        held.switch.release()


def phase_begins(job_id: str, role: str) -> None:
    """The allocator's peak is measured from here (CUDA)."""
    held = _TRACKED.get((job_id, role))
    if held is not None:
        footprint.reset_peak(held.switch.device)


def figures(job_id: str, role: str) -> dict[str, int]:
    """What GPU memory admission plans with, as this worker measured it for the
    instance: its peak during the phase that ends and what it kept on the device after
    its last switch-out (CUDA: the driver's figure for the process, else the
    allocator's reserved bytes; a CPU device with the switch on: the tensors' bytes)."""
    held = _TRACKED.get((job_id, role))
    if held is None or not held.switch.active:
        return {}
    fp = footprint.measure(held.switch.device)
    out: dict[str, int] = {}
    if fp is not None:
        out["device_peak_bytes"] = max(fp.peak_reserved_bytes, fp.held_bytes)
    elif not held.switch.own:      # no allocator to ask: the tensors' own bytes
        out["device_peak_bytes"] = held.switch.held_bytes()
    if held.resident is not None:
        out["device_resident_bytes"] = held.resident
    return out


def held_bytes(job_id: str) -> int:
    """Device bytes this worker's instances of ``job_id`` hold now."""
    return sum(t.switch.held_bytes() for (jid, _), t in _TRACKED.items() if jid == job_id)


def switch_in(job_id: str, role: str, scratch: Scratch,
              weights: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any] | None:
    """Bring a switched-out instance's device state back before its phase; None when
    nothing was out. Raises ``StateError`` when its scratch segment is gone."""
    held = _TRACKED.get((job_id, role))
    if held is None or not held.switch.switched_out:
        return None
    sw = held.switch
    if sw.own:
        return sw.into_own(weights).to_json()
    seg = scratch.get(role)
    if seg is None:
        raise StateError(f"job {job_id}: its switched-out {role} state "
                         f"(segment {scratch.name(role)!r}) is gone from this node")
    return sw.into(seg.tensors, seg.storage).to_json()


def switch_out(job_id: str, scratch: Scratch, keep: str | None = None) -> dict[str, Any]:
    """Every instance of ``job_id`` that holds device memory moves it to its scratch
    segment and frees it (but the instance of role ``keep``: a co-located member's
    role switch, the other role out before this one's phase); what moved, and what the
    worker still holds."""
    reports: list[dict[str, Any]] = []
    host = 0
    for (jid, role), held in list(_TRACKED.items()):
        sw = held.switch
        if jid != job_id or role == keep or not sw.active or sw.switched_out:
            continue
        if sw.own:
            reports.append({"role": role, **sw.out_own().to_json()})
            host += sw.host_bytes
            continue
        tensors = sw.tensors()
        seg = scratch.get(role)
        if seg is None or _layout(seg.tensors) != _layout(tensors):
            sw.release()                        # its old mapping, if any, is replaced
            scratch.put(role, tensors)         # the first time: an ordinary put
            report = sw.out(tensors, {}, None, copied=True)
        else:
            report = sw.out(tensors, seg.tensors, seg.storage)
        reports.append({"role": role, "segment": scratch.name(role), **report.to_json()})
    for (jid, _), held in _TRACKED.items():   # what each keeps there while out
        if jid == job_id and held.switch.switched_out:
            fp = footprint.measure(held.switch.device)
            held.resident = 0 if fp is None else fp.held_bytes
    return {"device_held_bytes": held_bytes(job_id), "host_bytes": host,
            "registered_bytes": _REGISTRY.registered_bytes,
            "staging_bytes": sum(c.pinned_bytes for c in _COPIERS.values()),
            "switches": reports}


def _layout(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """Names, dtypes and shapes in order: a segment written for other tensors is
    replaced, not written in place."""
    return [(k, t.dtype, tuple(t.shape)) for k, t in tensors.items()]
