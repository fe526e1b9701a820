"""The device switch in a member's resident worker (docs/node.md, "Device switch").

:mod:`~weave_slurm.hosted.phases` hands every job instance it keeps to :func:`track`,
calls :func:`switch_in` before the instance's next phase and reports
:func:`held_bytes` in each phase's result. The node daemon runs :func:`switch_out`
(an activation of its own) in this worker when another member's phase is about to
start on the node while this one still holds device memory; when the same member
runs next nothing moves.

Switch-out writes the instance's device tensors into the scratch segment
``device.<role>`` of its node-level job: created by an ordinary put the first time
(or when the layout changed, e.g. once Adam's moments exist), then written in place
through the worker's mapping, which stays registered with CUDA for the mapping's life.
Only this worker reads it back: a worker that is replaced rebuilds from ``state``.
Checkpoints skip scratch segments (:func:`~weave_slurm.node.index.is_scratch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weave_slurm.device import footprint
from weave_slurm.device.hostmem import Copier, HostRegistry
from weave_slurm.device.switch import DeviceSwitch, SwitchMode
from weave_slurm.errors import StateError
from weave_slurm.node.index import SCRATCH_KEY, scratch_name
from weave_slurm.workloads.api import JobRunner, Role

if TYPE_CHECKING:
    from torch import Tensor

    from weave_slurm.node.resident import PhaseContext

_REGISTRY = HostRegistry()
_COPIERS: dict[str, Copier] = {}     # one staging buffer per device in this worker


@dataclass
class _Tracked:
    runner: JobRunner
    switch: DeviceSwitch
    resident: int | None = None     # device bytes it kept after its last switch-out


_TRACKED: dict[tuple[str, Role], _Tracked] = {}


def track(job_id: str, role: Role, runner: JobRunner, mode: str) -> DeviceSwitch:
    """The switch of ``runner`` (a new one when the runner was replaced)."""
    key = (job_id, role)
    held = _TRACKED.get(key)
    if held is None or held.runner is not runner:
        if held is not None:
            held.switch.release()
        device = runner.context.device
        copier = _COPIERS.setdefault(device, Copier(device))
        held = _TRACKED[key] = _Tracked(runner, DeviceSwitch(
            runner.job, device, SwitchMode.parse(mode), _REGISTRY, copier))
    else:
        held.switch.mode = SwitchMode.parse(mode)
    return held.switch


def forget(job_id: str, role: Role) -> None:
    held = _TRACKED.pop((job_id, role), None)
    if held is not None:
        held.switch.release()


def phase_begins(job_id: str, role: Role) -> None:
    """The allocator's peak is measured from here (CUDA)."""
    held = _TRACKED.get((job_id, role))
    if held is not None:
        footprint.reset_peak(held.switch.device)


def figures(job_id: str, role: Role) -> dict[str, int]:
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


def switch_in(ctx: PhaseContext, role: Role,
              weights: Mapping[str, Tensor] | None = None) -> dict[str, Any] | None:
    """Bring a switched-out instance's device state back before its phase; None when
    nothing was out. Raises ``StateError`` when its scratch segment is gone."""
    held = _TRACKED.get((ctx.job.job_id, role))
    if held is None or not held.switch.switched_out:
        return None
    sw = held.switch
    if sw.own:
        return sw.into_own(weights).to_json()
    seg = ctx.state.get(scratch_name(role.value))
    if seg is None:
        raise StateError(f"job {ctx.job.job_id}: its switched-out {role.value} state "
                         f"(segment {scratch_name(role.value)!r}) is gone from this node")
    return sw.into(seg.tensors, seg.storage).to_json()


def switch_out(ctx: PhaseContext) -> dict[str, Any]:
    """The daemon's activation: every instance of this job that holds device memory
    moves it to the node's shared memory and frees it."""
    reports: list[dict[str, Any]] = []
    host = 0
    for (job_id, role), held in list(_TRACKED.items()):
        sw = held.switch
        if job_id != ctx.job.job_id or not sw.active or sw.switched_out:
            continue
        if sw.own:
            reports.append({"role": role.value, **sw.out_own().to_json()})
            host += sw.host_bytes
            continue
        tensors = sw.tensors()
        name = scratch_name(role.value)
        seg = ctx.state.get(name)
        if seg is None or [(e.name, e.dtype, tuple(e.shape)) for e in seg.index.tensors] \
                != sw.layout(tensors):
            sw.release()                        # its old mapping, if any, is replaced
            _put_scratch(ctx, name, tensors)   # the first time: an ordinary put
            report = sw.out(tensors, {}, None, copied=True)
        else:
            report = sw.out(tensors, seg.tensors, seg.storage)
        reports.append({"role": role.value, "segment": name, **report.to_json()})
    for (job_id, _), held in _TRACKED.items():   # what each keeps there while out
        if job_id == ctx.job.job_id and held.switch.switched_out:
            fp = footprint.measure(held.switch.device)
            held.resident = 0 if fp is None else fp.held_bytes
    return {"device_held_bytes": held_bytes(ctx.job.job_id), "host_bytes": host,
            "registered_bytes": _REGISTRY.registered_bytes,
            "staging_bytes": sum(c.pinned_bytes for c in _COPIERS.values()),
            "switches": reports}


def _put_scratch(ctx: PhaseContext, name: str, tensors: Mapping[str, Tensor]) -> None:
    from weave_slurm.node.client import NodeClient

    with NodeClient.from_env() as client:
        client.put_state(ctx.job, name, tensors, 0, extra={SCRATCH_KEY: True})
