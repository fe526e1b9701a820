"""Shared pieces of the runtime tests: members, bit-identity against a solo run, and
a group runner's clean end."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

import torch

from tests.harness.fleet import NodeFleet
from tests.harness.processes import node_status, pid_alive
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


def worker_pids(fleet: NodeFleet, job: str) -> dict[str, int]:
    """``node/node-level job -> pid`` of every live resident worker of ``job``, its
    training ranks' (``<job>.r<r>``) and its rollout engines' (``<job>.e<e>``)."""
    out: dict[str, int] = {}
    assert fleet.layout is not None
    for ref in (*fleet.layout.train, *fleet.layout.rollout):
        for row in node_status(ref.socket_path)["jobs"]:
            name, resident = str(row["job"]), row.get("resident") or {}
            if (name == job or name.startswith((f"{job}.r", f"{job}.e"))) and resident.get("pid") \
                    and pid_alive(int(resident["pid"])):
                out[f"{ref.name}/{name}"] = int(resident["pid"])
    return out


def kill_once(fleet: NodeFleet, job: str, victim: str, when: Callable[[RunningMember], bool],
              killed: list[int]) -> Callable[[GroupRunner], None]:
    """An ``on_tick`` for ``ex.run``: SIGKILL ``job``'s worker ``victim`` (``node/job``,
    as :func:`worker_pids` names it) the first time ``when(member)`` holds and it runs;
    its pid goes into ``killed``."""
    def on_tick(runner: GroupRunner) -> None:
        if killed or not when(runner.members[job]):
            return
        pid = worker_pids(fleet, job).get(victim)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return on_tick
