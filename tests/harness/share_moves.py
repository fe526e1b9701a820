"""A member moved between two GPU shares of one host in its group, through a running
weaved (issue 34; daemon/node_daemons.py, "Shares"), on any backend: the local one
(tests/runtime/test_weaved_shares.py) or the Slurm cluster of separate hosts
(tests/daemon/test_weaved_shares_slurm.py).

The plan's ``rollout_gpus`` and pins are written as a pooled placement would write them
(on a site whose placement pins, so that the job starts on a whole node and the shares'
hosts are the test's to choose); the rest is weaved's own: the allocations it asks, the
runtime that follows the plan (a pooled member: one engine per GPU of its share, so the
job samples per prompt and its site starts every engine, ``gangs = true``), the
allocations it returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import settle, wait_for
from tests.harness.weaved import call, wait_states
from weave_slurm.config.render import OptionInput, job_spec_toml
from weave_slurm.daemon.allocations import alloc_request
from weave_slurm.daemon.group_runtime import GroupRuntime
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, MemberPlan
from weave_slurm.daemon.service import Weaved
from weave_slurm.daemon.states import AllocState, GroupState
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.vocab import Phase

#: GPUs of each share (of the default site's 8-GPU h20 nodes).
SHARE_GPUS = 4
#: The job: a batch that does not depend on its engine count (it is pooled).
POOLED: dict[str, OptionInput] = {**OPTIONS, "sampling": "per_prompt"}


@dataclass(frozen=True)
class Moved:
    """What the scenario saw: the job, its group, the host both shares are on, the
    shares' rows and the allocation id of someone else's job on the other host."""

    job: int
    group: int
    host: str
    first: AllocRow
    second: AllocRow
    other: str


def _repin(w: Weaved, gid: int, job: int, slot: int) -> None:
    """The group's plan as a pooled placement writes it: rollout slots of shares,
    ``job`` pinned to ``slot`` (the next row's: weaved asks for it)."""
    group = w.store.group(gid)
    assert group is not None
    (member,) = group.plan.members
    w.store.update("group", gid, plan=dataclasses.replace(
        group.plan, members=(MemberPlan(job, (slot,), member.turns),),
        rollout_gpus=SHARE_GPUS).to_json())


def rollouts(w: Weaved, gid: int, job: int) -> list[str]:
    """The nodes of ``job``'s rollouts, in order (as the group's runtime names them)."""
    spans = getattr(w.driver, "spans", {}).get(gid, [])
    return [s.node for s in spans if s.job_id == str(job) and s.kind is Phase.ROLLOUT and s.ok]


def _rows(w: Weaved, gid: int) -> list[AllocRow]:
    return [r for r in w.store.allocs(gid, live_only=False) if r.role == "rollout"]


def _held_share(w: Weaved, gid: int, index: int) -> AllocRow:
    """The group's ``index``-th rollout row, once held: a share."""
    rows = wait_for(lambda: _rows(w, gid), 120, f"rollout row {index} held", interval_s=0.2,
                    until=lambda rows: len(rows) > index and rows[index].state is AllocState.HELD)
    assert rows[index].gpus_per_node == SHARE_GPUS, rows[index]
    return rows[index]


def _runs_on(w: Weaved, gid: int, job: int, key: str) -> None:
    wait_for(lambda: rollouts(w, gid, job), 180, f"job {job}'s rollouts on {key}",
             interval_s=0.2, until=lambda nodes: bool(nodes) and nodes[-1] == key)


def _released(w: Weaved, gid: int, index: int) -> AllocRow:
    rows = settle(lambda: _rows(w, gid), 90, interval_s=0.2,
                  until=lambda rows: rows[index].state is AllocState.RELEASED)
    assert rows[index].state is AllocState.RELEASED, rows[index]
    return rows[index]


def _occupy(w: Weaved, host: str, tag: str) -> str:
    """Someone else's job (another weaved's ``tag``) takes every GPU of ``host``."""
    other = GroupRow(99, "other", GroupState.ACTIVE, GroupPlan(1, 0, ()), 0.0, "")
    row = AllocRow(99, 99, "rollout", "h20-0", "h20", 1, 8, "h20", 1, AllocState.WANTED,
                   None, (), "")
    got = w.backend.allocate(alloc_request(other, row, 30, tag))
    assert got.nodes == (host,), got
    return got.alloc_id


def move_between_shares(w: Weaved, sock: Path, seed: int, iterations: int,
                        other_tag: str = "someone_else") -> Moved:
    """A job runs on a whole node X; its group becomes a pool of shares: its first share
    lands on the other host Y (X is still its whole node), which is returned once the job
    left it; X is then taken by someone else, so the group's next share lands on Y
    beside its first: the job is moved over to it while running, the first is returned,
    and the job completes. ``other_tag``: the someone else's allocations' instance tag
    (the caller releases them: ``release_all(backend, instance=other_tag)``)."""
    spec = job_spec_toml("shares", iterations=iterations, seed=seed, options=POOLED)
    job = int(call(sock, Op.SUBMIT, spec=spec, source="shares.toml")["job"])
    wait_for(lambda: w.driver.live(job), 180, f"job {job} at version 1", interval_s=0.1,
             until=lambda live: live is not None and live["version"] >= 1)
    row = w.store.job(job)
    assert row is not None and row.group_id is not None
    gid = row.group_id
    (whole,) = _rows(w, gid)
    assert whole.gpus_per_node == 8 and len(whole.nodes) == 1
    _repin(w, gid, job, 1)
    first = _held_share(w, gid, 1)
    (host,) = first.nodes
    assert host != whole.nodes[0]
    _runs_on(w, gid, job, f"{host}.{first.alloc_id}")
    _released(w, gid, 0)

    other = _occupy(w, whole.nodes[0], other_tag)
    _repin(w, gid, job, 2)
    second = _held_share(w, gid, 2)
    assert second.nodes == (host,) and second.alloc_id != first.alloc_id
    key = f"{host}.{second.alloc_id}"
    _runs_on(w, gid, job, key)
    live = w.driver.live(job)
    assert live is not None and live["version"] < iterations, live   # it moved running
    released = _released(w, gid, 1)
    assert f"no member of group {gid} is pinned to its node(s) {host} any more" in \
        w.store.transitions("alloc", released.key)[-2].reason
    assert isinstance(w.driver, GroupRuntime)
    layout = w.driver.ports[gid].layout
    assert [(n.name, n.slurm_host) for n in layout.rollout] == [(key, host)]

    done = wait_states(sock, [job], {"COMPLETED", "FAILED"}, 300, [])
    assert done[0]["state"] == "COMPLETED", done
    assert set(rollouts(w, gid, job)) == {whole.nodes[0], f"{host}.{first.alloc_id}", key}
    return Moved(job, gid, host, first, second, other)


def matches_solo(w: Weaved, job: int, seed: int, iterations: int) -> None:
    """``job`` ended with its solo run's weights, bit for bit."""
    live = w.driver.live(job)
    assert live is not None and live["version"] == iterations
    solo = run_solo(MemberSpec(str(job), seed=seed, steps=iterations, options=POOLED))
    assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job} differs"
