"""Shared pieces of the runtime tests: members, bit-identity against a solo run, and
a group runner's clean end."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.port import GroupPort
from weave_slurm.runtime.port_commands import Leave
from weave_slurm.runtime.port_events import MemberChanged
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.vocab import Phase


def members(n: int, steps: int, prefix: str) -> list[MemberSpec]:
    return [MemberSpec(f"{prefix}{i}", seed=11 + i, steps=steps, options=OPTIONS)
            for i in range(n)]


def group_weights(ex: GroupRunner, job_id: str) -> dict[str, torch.Tensor]:
    node = ex.members[job_id].train_node
    with NodeClient(node.socket_path) as client:
        seg = client.attach(JobRef(job_id, os.getuid()))["weights"]
    return {k: v.clone() for k, v in seg.tensors.items()}


def assert_same_as_solo(ex: GroupRunner, spec: MemberSpec) -> None:
    solo = run_solo(spec)
    got = group_weights(ex, spec.job_id)
    assert sorted(got) == sorted(solo.weights)
    differ = [k for k, v in solo.weights.items() if not torch.equal(got[k], v)]
    assert differ == [], f"{spec.job_id}: tensors differ from the solo run: {differ[:3]}"
    assert ex.members[spec.job_id].version == solo.version == spec.steps
    assert tuple(ex.members[spec.job_id].rewards) == solo.rewards


def ok_spans(ex: GroupRunner, job_id: str, kind: Phase) -> list[tuple[float, float]]:
    """(start, end) of ``job_id``'s phases of ``kind`` that ended well, in order."""
    return sorted((s.start_s, s.end_s) for s in ex.spans
                  if s.job_id == job_id and s.kind is kind and s.ok)


def leave_all(ex: GroupRunner, specs: Sequence[MemberSpec]) -> None:
    """The end of every test's runner: the members still in it leave, then it closes."""
    port = GroupPort(ex)
    for spec in specs:
        if spec.job_id in port.order:
            port.apply(Leave(spec.job_id))
    port.close()


def each_change(ex: GroupRunner, fn: Callable[[RunningMember, MemberChanged], None]
                ) -> Callable[[GroupRunner], None]:
    """An ``on_tick`` for ``ex.run``: ``fn(member, change)`` for each state change the
    runtime reported in that tick (its events, drained through a port), in order."""
    port = GroupPort(ex)

    def on_tick(_: GroupRunner) -> None:
        for event in port.events():
            if isinstance(event, MemberChanged):
                fn(ex.members[event.job_id], event)
    return on_tick
