"""weaved's group runtime (daemon/group_runtime.py) with real node daemons, one process
each: a group whose node hangs (its daemon stopped with SIGSTOP, as on a host whose
daemon or slurmd is stopped: connections are taken, nothing answers) holds only its own
worker. Another group's job joins, runs and completes meanwhile, the reconcile loop's
``drive`` comes back within its bound, and status reads answer; once the node goes on,
the stopped group's join completes and is reported (docs/reliability.md, C2)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.harness.processes import node_status
from tests.harness.scratch import shm_dir
from tests.harness.specs import job_spec, stored
from tests.harness.waits import wait_for
from weave_slurm.daemon.driver import JobOutcome
from weave_slurm.daemon.group_runtime import GroupRuntime, GroupRuntimeConfig
from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState, GroupState, JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import WeaveError
from weave_slurm.model.profile import simple_profile
from weave_slurm.runtime.group import MemberState, NodeRef
from weave_slurm.vocab import Pool

pytestmark = [pytest.mark.torch, pytest.mark.slow]

T0 = 1000.0
T = TypeVar("T")


@dataclass
class Nodes:
    """Node daemons ``r`` (rollout, both groups), ``t1`` and ``t2`` (training, groups 1
    and 2), as processes serving under ``shm``."""

    shm: Path
    procs: dict[str, subprocess.Popen[bytes]]

    def ref(self, alloc: AllocRow, node: str, pool: Pool) -> NodeRef:
        return NodeRef(node, pool, self.sock(node))

    def sock(self, name: str) -> Path:
        return self.shm / name / "weave" / "node.sock"

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.procs[name].send_signal(sig)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """:class:`Nodes`, started; at the end all of them go on (SIGCONT), then end."""
    with shm_dir("weave-test-c2-") as shm:
        fleet = Nodes(shm, {})
        try:
            for name in ("r", "t1", "t2"):
                root = shm / name / "weave"
                root.parent.mkdir(mode=0o711)
                with open(tmp_path / f"{name}.log", "wb") as out:
                    fleet.procs[name] = subprocess.Popen(
                        [sys.executable, "-m", "weave_slurm.cli", "node", "serve",
                         "--host-mem-gib", "0.5", "--root", str(root),
                         "--checkpoint-root", str(tmp_path / "ckpt" / name),
                         "--checkpoint-interval-s", "0"], stdout=out, stderr=out)
            for name in fleet.procs:
                wait_for(functools.partial(node_status, fleet.sock(name)), 60,
                         f"node daemon {name} (see {tmp_path}/{name}.log)", interval_s=0.1,
                         ignore=(WeaveError, OSError))
            yield fleet
        finally:
            for proc in fleet.procs.values():
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
            for proc in fleet.procs.values():
                proc.wait(30)


def _two_groups(store: Store) -> tuple[int, int]:
    """Groups 1 and 2, ACTIVE on held allocations (rollout node ``r``, training node
    ``t1`` / ``t2``), job ``b`` placed in group 1 and ``a`` in group 2 (one step)."""
    a, b = (store.add_job(uid=os.getuid(), user="root", name=n,
                          **stored(n, job_spec(n, seed=1, iterations=1)), source=f"{n}.toml",
                          now=T0, profile=simple_profile(n, 1, 1, 1.5)) for n in "ab")
    store.commit_placement([(1, "t1.1", GroupPlan(1, 1, (MemberPlan(b, (0,)),)), True),
                            (2, "t1.2", GroupPlan(1, 1, (MemberPlan(a, (0,)),)), True)],
                           [(b, 1, "new_group into group 1"), (a, 2, "new_group into group 2")],
                           T0)
    for gid in (1, 2):
        for role, node in (("rollout", "r"), ("train", f"t{gid}")):
            key = store.add_alloc(group_id=gid, role=role, pool=f"{role}-0", partition=role,
                                  node_count=1, gpus_per_node=8, gpu_type=None,
                                  cpus_per_node=1, now=T0, reason="initial")
            store.transition("alloc", key, AllocState.ALLOCATING, "asking", T0)
            store.transition("alloc", key, AllocState.HELD, "granted", T0,
                             alloc_id=f"{gid}{role[0]}", nodes=json.dumps([node]))
        store.transition("group", gid, GroupState.ACTIVE, "held", T0)
    return a, b


def _within(seconds: float, call: Callable[[], T]) -> T:
    """``call``'s result, which must come within ``seconds`` (it runs on a thread: a
    call that hangs fails the test instead of hanging it)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert out, f"no answer within {seconds} s (still waiting after " \
                f"{time.monotonic() - start:.1f} s)"
    return out[0]


def test_a_group_whose_node_hangs_holds_no_other_group_nor_status(
        nodes: Nodes, tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    rt = GroupRuntime(nodes.ref, GroupRuntimeConfig(drive_wait_s=0.5))
    rt.start()
    try:
        a, b = _two_groups(store)
        _within(30, lambda: rt.drive(store, T0))   # both groups' runtimes are built
        assert sorted(rt.ports) == [1, 2]
        nodes.signal("t2", signal.SIGSTOP)   # group 2's training node hangs
        store.transition("job", a, JobState.RUNNING, "0 step(s) launched", T0)
        # group 2's join of a now waits on t2 (a client timeout of 120 s): drive does not
        assert _within(5, lambda: rt.drive(store, T0 + 1)) == []
        store.transition("job", b, JobState.RUNNING, "0 step(s) launched", T0 + 2)
        assert _within(5, lambda: rt.drive(store, T0 + 2)) == []
        member = rt.ports[1].view(str(b))   # b joined group 1 in that same drive
        assert member is not None and member.state is not MemberState.CANCELLED
        assert _within(1, lambda: rt.in_use(2)) == frozenset({"r", "t2"})
        assert _within(1, lambda: rt.waiting(a)) is None
        # group 1 runs b to its end while group 2 still waits on t2
        outcomes: list[JobOutcome] = []
        deadline = time.monotonic() + 240
        while not outcomes and time.monotonic() < deadline:
            outcomes = _within(5, lambda: rt.drive(store, T0 + 3))
            time.sleep(0.2)
        assert [(o.job_id, o.state) for o in outcomes] == [(b, JobState.COMPLETED)], outcomes
        assert _within(1, lambda: rt.live(a)) is None   # group 2 still waits on t2 in a's join
        live = _within(1, lambda: rt.live(b))
        assert live is not None and live["phase"] == "-"
        assert rt.ports[1].view(str(b)) is not None   # it leaves once its end is stored
        store.transition("job", b, JobState.COMPLETED, "as weaved stores it", T0 + 3)
        nodes.signal("t2", signal.SIGCONT)   # the node goes on: a joins
        wait_for(lambda: _within(5, lambda: rt.drive(store, T0 + 4)) == [] and
                 rt.live(a) is not None, 60, "job a joining group 2")
        left = rt.ports[1].view(str(b))   # its end stored, b left (its last row kept)
        assert left is None or left.state is MemberState.CANCELLED, left
        assert rt.live(b) == live
    finally:
        nodes.signal("t2", signal.SIGCONT)
        rt.close()
        store.close()
