"""Parse ``squeue --json`` (jobs) and ``squeue --steps`` (text) into backend values.

Written against Slurm 22.05's OpenAPI v0.0.38 output and defensive about later
schemas: ``job_state`` may be a string or a list, ``tres_per_node`` may read
``gres:gpu:h20:8`` (22.05) or ``gres/gpu:h20=8`` (23.x+), numbers may be wrapped
as ``{"set": true, "number": N}``. Malformed entries are skipped, not fatal.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from weave_slurm.errors import StateError
from weave_slurm.slurm import hostlist
from weave_slurm.slurm.backend import (
    AllocatedComponent,
    Allocation,
    AllocationState,
    StepInfo,
    parse_comment,
)

log = logging.getLogger(__name__)

STEP_FORMAT = "%i|%j|%N|%A"

_STATES = {
    "PENDING": AllocationState.PENDING, "CONFIGURING": AllocationState.PENDING,
    "REQUEUED": AllocationState.PENDING, "RESV_DEL_HOLD": AllocationState.PENDING,
    "RUNNING": AllocationState.RUNNING, "SUSPENDED": AllocationState.RUNNING,
    "STOPPED": AllocationState.RUNNING, "SIGNALING": AllocationState.RUNNING,
    "COMPLETING": AllocationState.ENDING, "STAGE_OUT": AllocationState.ENDING,
}
_GPU_RE = re.compile(r"gpu(?::(?P<type>[A-Za-z0-9_.-]+?))?[:=](?P<count>\d+)")


def load_json(text: str, what: str) -> dict[str, Any]:
    """The top-level object of a ``--json`` answer; StateError if it is not one."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateError(f"{what}: output is not JSON ({exc}); first bytes: {text[:80]!r}")\
            from exc
    if not isinstance(data, dict):
        raise StateError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _number(value: Any) -> int | None:
    if isinstance(value, dict):
        return _number(value.get("number")) if value.get("set", True) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def job_state(raw: Any) -> AllocationState:
    """Fold a Slurm job state (string or list of flags) into an AllocationState."""
    names = raw if isinstance(raw, list) else [raw]
    for name in names:
        if isinstance(name, str) and name.upper() in _STATES:
            return _STATES[name.upper()]
    return AllocationState.ENDED


def gpus_per_node(tres_per_node: str) -> tuple[str | None, int]:
    """(GPU type, count) from ``gres:gpu:h20:8``, ``gres/gpu:h20=8``, ``gpu:h20:8(S:0)``."""
    for item in tres_per_node.split(","):
        body = re.sub(r"\(.*?\)", "", item.split("gres", 1)[-1].lstrip(":/"))
        m = _GPU_RE.fullmatch(body)
        if m:
            return m.group("type"), int(m.group("count"))
    return None, 0


def _component(job: dict[str, Any]) -> AllocatedComponent:
    gpu_type, gpus = gpus_per_node(str(job.get("tres_per_node") or ""))
    return AllocatedComponent(partition=str(job.get("partition") or ""),
                              nodes=hostlist.expand(str(job.get("nodes") or "")),
                              gpus_per_node=gpus, gpu_type=gpu_type,
                              cpus=_number(job.get("cpus")) or 0)


def _fold_states(states: list[AllocationState]) -> AllocationState:
    order = [AllocationState.ENDED, AllocationState.ENDING, AllocationState.PENDING,
             AllocationState.RUNNING]
    return min(states, key=order.index)


def parse_jobs(text: str, prefix: str = "", *, uid: int | None = None,
               instance: str | None = None) -> tuple[Allocation, ...]:
    """Allocations whose job name starts with ``prefix``; het components are merged.

    ``uid``: only jobs of that user (``user_id``); ``instance``: only jobs whose comment
    carries that instance tag (:func:`~weave_slurm.slurm.backend.parse_comment`).
    """
    data = load_json(text, "squeue --json")
    groups: dict[int, list[dict[str, Any]]] = {}
    for job in data.get("jobs") or []:
        if not isinstance(job, dict):
            continue
        job_id = _number(job.get("job_id"))
        if job_id is None:
            log.warning("squeue --json: job without job_id skipped")
            continue
        het = _number(job.get("het_job_id")) or 0
        groups.setdefault(het or job_id, []).append(job)
    out = []
    for alloc_id, parts in sorted(groups.items()):
        parts.sort(key=lambda j: _number(j.get("het_job_offset")) or 0)
        head = parts[0]
        name = str(head.get("name") or "")
        tag = parse_comment(str(head.get("comment") or ""))
        if not name.startswith(prefix) or (uid is not None
                                           and _number(head.get("user_id")) != uid):
            continue
        if instance is not None and (tag is None or tag.instance != instance):
            continue
        out.append(Allocation(
            alloc_id=str(alloc_id), name=name,
            group_id=tag.group_id if tag else None, pool=tag.pool if tag else None,
            state=_fold_states([job_state(j.get("job_state")) for j in parts]),
            components=tuple(_component(j) for j in parts),
            instance=tag.instance if tag else None))
    return tuple(out)


def _alloc_of(step_id: str) -> str:
    """``8.1`` -> ``8``; ``3+1.0`` -> ``3`` (a het component's step)."""
    return step_id.split(".", 1)[0].split("+", 1)[0]


#: Steps Slurm runs in a job itself (``<job>.batch``: an sbatch job's script, here the
#: allocation script holding the nodes; ``<job>.extern``): never one of weave's.
SLURM_OWN_STEPS = frozenset({"batch", "extern"})


def parse_steps(text: str) -> tuple[StepInfo, ...]:
    """Steps from ``squeue --steps -h -o '%i|%j|%N|%A'`` (22.05 has no step JSON); Slurm's
    own (:data:`SLURM_OWN_STEPS`) left out."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or "." not in parts[0]:
            continue
        step_id, name, nodes, ntasks = parts
        if step_id.rpartition(".")[2] in SLURM_OWN_STEPS:
            continue
        out.append(StepInfo(alloc_id=_alloc_of(step_id), step_id=step_id, name=name,
                            nodes=hostlist.expand(nodes),
                            ntasks=int(ntasks) if ntasks.isdigit() else 0))
    return tuple(out)
