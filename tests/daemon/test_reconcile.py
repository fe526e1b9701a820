"""Reconciler.tick with every input passed in: a real store, the CLI backend over a fake
runner (the exact argv of every Slurm command), a virtual clock and the idle driver."""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness.specs import stored
from weave_slurm.clock import VirtualClock
from weave_slurm.config.site import SiteConfig, default_site
from weave_slurm.daemon import allocplan, membership
from weave_slurm.daemon.driver import IdleDriver, JobOutcome
from weave_slurm.daemon.reconcile import NODE_STEP, NodeStepFactory, PoolRequest, Reconciler
from weave_slurm.daemon.records import AllocRow, GroupPlan, GroupRow, MemberPlan
from weave_slurm.daemon.retries import (
    NODE_DAEMON_STABLE_S,
    NODE_DAEMON_TRIES,
    RETRY_FIRST_S,
    RETRY_MAX_S,
)
from weave_slurm.daemon.states import AllocState, GroupState, JobState, StepRunState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity, Group, Member
from weave_slurm.slurm.backend import DEFAULT_INSTANCE, StepSpec, group_comment
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.command_runner import SlurmCommandError
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner
from weave_slurm.slurm.squeue import STEP_FORMAT

FIX = Path(__file__).parents[1] / "slurm" / "fixtures"
INSTANCE = "t1"  # allocation names weave-gt1.<group>-<pool>
POOLS = {"rollout": PoolRequest("h20", 8, "h20", 2), "train": PoolRequest("h800", 8, "h800", 2)}
T0 = 1000.0
UID = os.getuid()  # weaved's: squeue is asked for this user's jobs
OTHER_UID = 1000 if UID != 1000 else 1001  # an ordinary user's
SQUEUE = ("squeue", "--json", f"--user={UID}")
STEPS = ("squeue", "--steps", "-h", "-o", STEP_FORMAT)
GONE = "scancel: error: Kill job error on job id {}: Invalid job id specified"


def _comment(name: str) -> str:
    """The comment weaved gives allocation ``weave-g<label>-<pool>`` (the instance is the
    label's ``<instance>.``, the default one without)."""
    label, _, pool = name.removeprefix("weave-g").partition("-")
    instance = label.rpartition(".")[0] or DEFAULT_INSTANCE
    return group_comment(label, pool, instance) if pool else ""


def _script_options(path: str) -> tuple[str, ...]:
    """The ``#SBATCH`` options of the allocation script at ``path``, in order."""
    return tuple(line.split(None, 1)[1] for line in Path(path).read_text().splitlines()
                 if line.startswith("#SBATCH "))


def _flags(argv: tuple[str, ...]) -> dict[str, str]:
    return dict(a[2:].partition("=")[::2] for a in argv if a.startswith("--") and "=" in a)


@dataclass
class Step:
    step_id: str
    name: str
    nodes: tuple[str, ...]
    proc: int  # index of its srun in FakeRunner.processes


@dataclass
class Slurm:
    """A tiny queue behind the fake runner: squeue/sbatch/srun/scancel as Slurm 22.05
    answers them (squeue --json entries are the fixture's, with fields replaced). squeue
    --json lists every user's jobs whatever ``--user`` says: the rows' ``user_id`` must
    be checked by the backend itself."""

    fake: FakeRunner
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    steps: dict[str, Step] = field(default_factory=dict)
    refuse: dict[str, FakeReply] = field(default_factory=dict)  # job name -> sbatch reply
    squeue_reply: FakeReply | None = None  # set: squeue --json answers this instead
    hook: Callable[[tuple[str, ...]], None] = lambda argv: None  # before every sbatch/srun/scancel
    next_id: int = 11
    used: dict[str, int] = field(default_factory=dict)  # partition -> nodes handed out
    step_seq: dict[str, int] = field(default_factory=dict)  # alloc id -> last step number
    exits: dict[tuple[str, str], int] = field(default_factory=dict)  # (alloc, step name) ->
    # the exit code its srun ends with at once (the step never stays listed)
    scripts: dict[int, tuple[str, ...]] = field(default_factory=dict)  # call index -> the
    # submitted allocation script's #SBATCH options

    def __post_init__(self) -> None:
        data = json.loads((FIX / "squeue_22.05_het.json").read_text())
        self._meta = data["meta"]
        self._template = next(j for j in data["jobs"] if j["job_id"] == 2)  # plain, RUNNING
        self.fake.on(["squeue", "--json"], self._squeue)
        self.fake.on(STEPS, self._squeue_steps)
        self.fake.on(["sbatch", "--parsable"], self._sbatch)
        self.fake.on(["srun"], self._srun)
        self.fake.on(["scancel"], self._scancel)

    def add(self, name: str, nodes: tuple[str, ...], state: str = "RUNNING",
            job_id: int | None = None, *, uid: int = UID, comment: str | None = None) -> str:
        """A job Slurm lists: by default weaved's allocation ``weave-g<label>-<pool>``
        with weaved's comment; returns its id."""
        if job_id is None:
            job_id, self.next_id = self.next_id, self.next_id + 1
        job = copy.deepcopy(self._template)
        partition = nodes[0].split("-")[0]
        job.update(job_id=job_id, name=name, job_state=state, user_id=uid,
                   comment=_comment(name) if comment is None else comment,
                   nodes=",".join(nodes), partition=partition,
                   tres_per_node=f"gres:gpu:{partition}:8", node_count=len(nodes))
        self.jobs[job_id] = job
        return str(job_id)

    def exit_step(self, step_id: str, returncode: int) -> None:
        """The step's tasks exit (Slurm no longer lists it; its srun exits)."""
        self._end_step(step_id, returncode)

    def vanish(self, alloc_id: str) -> None:
        """The allocation is gone from Slurm (a node failure, an admin's scancel)."""
        self._end(alloc_id, returncode=1)

    def _end(self, alloc_id: str, returncode: int) -> None:
        del self.jobs[int(alloc_id)]
        for sid in [s for s in self.steps if s.split(".")[0] == alloc_id]:
            self._end_step(sid, returncode)

    def _end_step(self, step_id: str, returncode: int) -> None:
        proc = self.fake.processes[self.steps.pop(step_id).proc]
        if proc.returncode is None:  # srun exits once its step ends
            proc.returncode = returncode

    def _squeue(self, argv: tuple[str, ...]) -> FakeReply:
        if self.squeue_reply is not None:
            return self.squeue_reply
        return FakeReply(stdout=json.dumps({"meta": self._meta, "errors": [],
                                            "jobs": list(self.jobs.values())}))

    def _squeue_steps(self, argv: tuple[str, ...]) -> FakeReply:
        return FakeReply(stdout="".join(f"{s.step_id}|{s.name}|{','.join(s.nodes)}|"
                                        f"{len(s.nodes)}\n" for s in self.steps.values()))

    def _sbatch(self, argv: tuple[str, ...]) -> FakeReply:
        options = _script_options(argv[-1])
        self.hook(("sbatch", *options))
        self.scripts[len(self.fake.calls) - 1] = options
        f = _flags(options)
        if f["job-name"] in self.refuse:
            return self.refuse[f["job-name"]]
        part, n = f["partition"], int(f["nodes"])
        first = self.used.get(part, 0)
        self.used[part] = first + n
        alloc_id = self.add(f["job-name"], tuple(f"{part}-{i}" for i in range(first, first + n)))
        return FakeReply(stdout=f"{alloc_id}\n")

    def _srun(self, argv: tuple[str, ...]) -> FakeReply:
        self.hook(argv)
        f = _flags(argv)
        alloc = f["jobid"]
        n = self.step_seq[alloc] = self.step_seq.get(alloc, -1) + 1
        if (alloc, f["job-name"]) in self.exits:
            return FakeReply(exited=self.exits[alloc, f["job-name"]])
        self.steps[f"{alloc}.{n}"] = Step(f"{alloc}.{n}", f["job-name"],
                                          tuple(filter(None, f.get("nodelist", "").split(","))),
                                          len(self.fake.processes))
        return FakeReply()

    def _scancel(self, argv: tuple[str, ...]) -> FakeReply:
        self.hook(argv)
        target = argv[1]
        if target in self.steps:
            self._end_step(target, returncode=-15)
        elif target.isdigit() and int(target) in self.jobs:
            self._end(target, returncode=-15)
        else:
            return FakeReply(stderr=GONE.format(target), returncode=1)
        return FakeReply()


@dataclass
class Rig:
    store: Store
    fake: FakeRunner
    slurm: Slurm
    clock: VirtualClock
    rec: Reconciler

    def restart(self, **kw: Any) -> Reconciler:
        """A new daemon on the same store and the same Slurm (no handles, no backoff)."""
        self.rec = _reconciler(self.store, self.fake, self.clock, **kw)
        return self.rec

    def tick(self, at: float | None = None) -> None:
        if at is not None:
            self.clock.sleep_until(at)
        self.rec.tick()

    def argvs(self, program: str, since: int = 0) -> list[tuple[str, ...]]:
        """The calls of ``program`` from call ``since`` on (``sbatch``: its script's
        ``#SBATCH`` options in place of the script's path)."""
        return [("sbatch", *self.slurm.scripts[i]) if program == "sbatch" else c.argv
                for i, c in enumerate(self.fake.calls) if i >= since and c.argv[0] == program]

    def alloc_rows(self) -> list[AllocRow]:
        return self.store.allocs(live_only=False)

    def reasons(self, entity: str, key: int) -> list[tuple[str | None, str, str]]:
        return [(t.src, t.dst, t.reason) for t in self.store.transitions(entity, key)]


def _reconciler(store: Store, fake: FakeRunner, clock: VirtualClock, *,
                driver: IdleDriver | None = None, node_step: NodeStepFactory | None = None,
                instance: str = INSTANCE, site: SiteConfig | None = None) -> Reconciler:
    return Reconciler(store, SlurmCliBackend(runner=fake), Capacity.from_site(default_site()),
                      POOLS, driver or IdleDriver(), clock, instance=instance,
                      node_step=node_step, site=site)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    store, fake, clock = Store(tmp_path / "w.db"), FakeRunner(), VirtualClock(T0)
    yield Rig(store, fake, Slurm(fake), clock, _reconciler(store, fake, clock))
    store.close()


def _submit(store: Store, name: str = "a", rollout_s: float = 10, slo: float = 1.5,
            **profile: Any) -> int:
    return store.add_job(uid=1000, user="alice", name=name, **stored(name),
                         source=f"{name}.toml", now=T0,
                         profile=simple_profile(name, rollout_s, 10, slo, **profile))


def _job_state(store: Store, job_id: int) -> JobState:
    job = store.job(job_id)
    assert job is not None
    return job.state


def _group(store: Store, group_id: int = 1) -> GroupRow:
    group = store.group(group_id)
    assert group is not None
    return group


def _srun(alloc_id: str, name: str, node: str) -> tuple[str, ...]:
    return ("srun", f"--jobid={alloc_id}", "--overlap", "--exact", f"--job-name={name}",
            "-n", "1", "-c", "1", "-N", "1", f"--nodelist={node}", "sleep", "infinity")


def _sbatch(name: str, partition: str) -> tuple[str, ...]:
    """An allocation script's options as :meth:`Rig.argvs` gives them."""
    return ("sbatch", f"--job-name={name}", f"--comment={_comment(name)}", "--output=/dev/null",
            f"--partition={partition}", "--nodes=1", "--ntasks-per-node=1",
            "--cpus-per-task=2", f"--gres=gpu:{partition}:8")


def _running(rig: Rig, **profile: Any) -> int:
    """One job, placed and running in group 1 (rollout 11 on h20-0, train 12 on h800-0)."""
    job = _submit(rig.store, **profile)
    rig.tick()
    assert _job_state(rig.store, job) is JobState.RUNNING
    assert set(rig.slurm.steps) == {"11.0", "12.0"}
    return job


# -- a pending job, from nothing to running ---------------------------------------------


def test_one_tick_places_allocates_and_launches_writing_each_intent_first(rig: Rig) -> None:
    seen: list[tuple[str, list[str], list[str]]] = []
    rig.slurm.hook = lambda argv: seen.append(
        (argv[0], [a.state.value for a in rig.alloc_rows()],
         [s.state.value for s in rig.store.steps(live_only=False)]))
    job = _submit(rig.store)
    rig.tick()
    assert rig.argvs("sbatch") == [_sbatch("weave-gt1.1-h20-0", "h20"),
                                   _sbatch("weave-gt1.1-h800-0", "h800")]
    assert rig.argvs("sbatch")[0][2] == "--comment=weave:t1:t1.1:h20-0"  # uid + this tag: ours
    assert [c.argv for c in rig.fake.calls if c.spawned] == [
        _srun("11", "weave-j1-h20-0", "h20-0"), _srun("12", "weave-j1-h800-0", "h800-0")]
    assert rig.argvs("scancel") == []
    # every call found its intent already durable
    assert seen == [("sbatch", ["ALLOCATING", "WANTED"], []),
                    ("sbatch", ["HELD", "ALLOCATING"], []),
                    ("srun", ["HELD", "HELD"], ["LAUNCHING"]),
                    ("srun", ["HELD", "HELD"], ["RUNNING", "LAUNCHING"])]
    assert [(a.pool, a.state, a.alloc_id, a.nodes) for a in rig.alloc_rows()] == [
        ("h20-0", AllocState.HELD, "11", ("h20-0",)),
        ("h800-0", AllocState.HELD, "12", ("h800-0",))]
    assert rig.reasons("alloc", 1)[-1] == ("ALLOCATING", "HELD", "granted as 11")
    group = _group(rig.store)
    assert (group.label, group.state, group.plan.job_ids) == ("t1.1", GroupState.ACTIVE, (job,))
    assert rig.reasons("job", job)[1:] == [("PENDING", "PLACED", "new_group into group 1"),
                                           ("PLACED", "RUNNING", "2 step(s) launched")]
    assert rig.rec.ticks == 1 and rig.rec.world_error is None


def test_a_quiet_tick_reads_the_world_and_calls_nothing_else(rig: Rig) -> None:
    _running(rig)
    before = len(rig.fake.calls)
    rig.tick(at=T0 + 5)
    assert [c.argv for c in rig.fake.calls[before:]] == [SQUEUE, STEPS, STEPS]


# -- 1. adoption after a restart ---------------------------------------------------------


def _allocating(store: Store, job: int) -> None:
    """What a daemon killed right after writing both ALLOCATING intents leaves."""
    store.commit_placement([(1, "t1.1", GroupPlan(1, 1, (MemberPlan(job, (0,)),)), True)],
                           [(job, 1, "new_group into group 1")], T0)
    for role, pool in POOLS.items():
        key = store.add_alloc(group_id=1, role=role, pool=f"{pool.partition}-0",
                              partition=pool.partition, node_count=1,
                              gpus_per_node=pool.gpus_per_node, gpu_type=pool.gpu_type,
                              cpus_per_node=pool.cpus_per_node, now=T0, reason="initial")
        store.transition("alloc", key, AllocState.ALLOCATING, "requesting", T0)


def test_restart_adopts_the_allocations_slurm_lists_and_asks_for_none(rig: Rig) -> None:
    job = _submit(rig.store)
    _allocating(rig.store, job)
    rollout = rig.slurm.add("weave-gt1.1-h20-0", ("h20-5",))
    train = rig.slurm.add("weave-gt1.1-h800-0", ("h800-2",))
    rig.tick(at=T0 + 30)
    assert rig.argvs("sbatch") == [] and rig.argvs("scancel") == []
    assert [(a.state, a.alloc_id, a.nodes) for a in rig.alloc_rows()] == [
        (AllocState.HELD, rollout, ("h20-5",)), (AllocState.HELD, train, ("h800-2",))]
    for key in (1, 2):
        assert rig.reasons("alloc", key)[-1] == (
            "ALLOCATING", "HELD", "adopted: Slurm lists it after a restart")
        assert rig.store.transitions("alloc", key)[-1].ts == T0 + 30
    # and the job runs on the adopted nodes
    assert [c.argv for c in rig.fake.calls if c.spawned] == [
        _srun(rollout, "weave-j1-h20-0", "h20-5"), _srun(train, "weave-j1-h800-0", "h800-2")]
    assert _job_state(rig.store, job) is JobState.RUNNING


def test_restart_asks_again_only_for_an_intent_slurm_does_not_list(rig: Rig) -> None:
    job = _submit(rig.store)
    _allocating(rig.store, job)
    train = rig.slurm.add("weave-gt1.1-h800-0", ("h800-2",))
    rig.tick()
    assert rig.reasons("alloc", 1)[-3:] == [
        ("ALLOCATING", "WANTED", "not in Slurm after a restart; ask again"),
        ("WANTED", "ALLOCATING", "requesting weave-gt1.1-h20-0"),
        ("ALLOCATING", "HELD", "granted as 12")]
    assert rig.argvs("sbatch") == [_sbatch("weave-gt1.1-h20-0", "h20")]
    assert [a.alloc_id for a in rig.alloc_rows()] == ["12", train]
    assert rig.argvs("scancel") == []


def test_restart_keeps_the_steps_slurm_still_runs(rig: Rig) -> None:
    job = _running(rig)
    rig.restart()  # a new process: no launcher handles
    before = len(rig.fake.calls)
    rig.tick(at=T0 + 60)
    assert [c.argv for c in rig.fake.calls[before:]] == [SQUEUE, STEPS, STEPS]
    assert [s.state for s in rig.store.steps(job_id=job)] == [StepRunState.RUNNING] * 2
    assert _job_state(rig.store, job) is JobState.RUNNING


# -- 2. orphans --------------------------------------------------------------------------


def test_only_our_orphans_are_released_by_uid_and_instance_tag(rig: Rig) -> None:
    _running(rig)
    orphan = rig.slurm.add("weave-gt1.7-h20-0", ("h20-9",))
    old = rig.slurm.add("weave-gt1.8-h20-0", ("h20-13",),   # ours, from before instance tags
                        comment="weave-group=t1.8,pool=h20-0")
    rig.slurm.add("weave-g3-h20-0", ("h20-10",))  # another daemon's (no instance: default)
    rig.slurm.add("weave-gt12.1-h20-0", ("h20-11",))  # instance t12, not t1
    rig.slurm.add("interactive", ("h20-12",))  # our uid's own job, no comment
    rig.slurm.add("weave-gt1.9-h20-0", ("h20-14",), uid=OTHER_UID)  # a user's, our name+tag
    rig.slurm.add("weave-g999-h20-0", ("h20-15",), uid=OTHER_UID, comment="")  # sbatch -J
    marks = {e: [len(rig.store.transitions(e, k)) for k in (1, 2)] for e in ("alloc", "step")}
    before = len(rig.fake.calls)
    rig.tick(at=T0 + 5)
    assert [c.argv for c in rig.fake.calls[before:]] == [
        SQUEUE, STEPS, STEPS, STEPS, STEPS, ("scancel", orphan), ("scancel", old)]
    assert {e: [len(rig.store.transitions(e, k)) for k in (1, 2)]
            for e in ("alloc", "step")} == marks
    assert sorted(rig.slurm.jobs) == [11, 12, 15, 16, 17, 18, 19]


def test_a_daemon_without_instance_owns_only_default_tagged_allocations(rig: Rig) -> None:
    rec = rig.restart(instance="")
    assert (rec.tag, rec.prefix) == (DEFAULT_INSTANCE, "weave-g")
    job = _submit(rig.store)
    foreign = rig.slurm.add("weave-g999-h20-0", ("h20-7",), uid=OTHER_UID, comment="")
    named = rig.slurm.add("weave-gt1.1-h20-0", ("h20-8",))  # instance t1's: same prefix
    orphan = rig.slurm.add("weave-g5-h20-0", ("h20-9",))  # comment weave:default:5:h20-0
    rig.tick()
    assert rig.argvs("sbatch") == [  # the request carries the default tag
        ("sbatch", "--job-name=weave-g1-h20-0", "--comment=weave:default:1:h20-0",
         *_sbatch("weave-g1-h20-0", "h20")[3:]),
        ("sbatch", "--job-name=weave-g1-h800-0",
         "--comment=weave:default:1:h800-0", *_sbatch("weave-g1-h800-0", "h800")[3:])]
    assert rig.argvs("scancel") == [("scancel", orphan)]
    assert {foreign, named} <= {str(j) for j in rig.slurm.jobs}
    assert _job_state(rig.store, job) is JobState.RUNNING
    with pytest.raises(ConfigError, match="--instance 'default' is the tag of a weaved"):
        rig.restart(instance=DEFAULT_INSTANCE)


def test_a_released_allocation_still_ending_in_slurm_is_not_cancelled_again(rig: Rig) -> None:
    job = _running(rig)
    rig.store.transition("job", job, JobState.CANCELLING, "cancelled by uid 1000", T0 + 1)
    rig.tick(at=T0 + 2)
    assert rig.argvs("scancel") == [("scancel", "11.0"), ("scancel", "12.0"),
                                    ("scancel", "11"), ("scancel", "12")]
    rig.slurm.add("weave-gt1.1-h20-0", ("h20-0",), state="COMPLETING", job_id=11)  # ending
    rig.tick(at=T0 + 3)
    assert len(rig.argvs("scancel")) == 4


# -- 3. an allocation that vanished ------------------------------------------------------


def test_an_allocation_slurm_is_ending_unasked_is_lost_at_once(rig: Rig) -> None:
    """Killed on a failed node, a job stays COMPLETING in Slurm until the node answers
    again (minutes, or never for a host cut off): weaved must not wait for it to leave
    squeue before it asks for a replacement."""
    job = _running(rig)
    rig.slurm.jobs[11]["job_state"] = "COMPLETING"
    rig.tick(at=T0 + 10)
    why = "rollout allocation 11 (node(s) h20-0) was ended by Slurm, not released by weaved"
    lost, train, new = rig.alloc_rows()
    assert rig.reasons("alloc", lost.key)[-1] == ("HELD", "LOST", why)
    assert train.state is AllocState.HELD
    assert (new.role, new.state, new.alloc_id) == ("rollout", AllocState.HELD, "13")
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.reason.startswith(f"{why}; asking for a new")
    rig.tick(at=T0 + 11)     # still listed as ending: neither adopted nor an orphan
    assert ("scancel", "11") not in rig.argvs("scancel")
    assert [a.alloc_id for a in rig.store.allocs()] == ["12", "13"]


def test_a_vanished_allocation_is_lost_and_its_group_asks_for_a_replacement(rig: Rig) -> None:
    job = _running(rig)
    rig.slurm.vanish("11")
    rig.tick(at=T0 + 10)
    why = "rollout allocation 11 (node(s) h20-0) vanished from Slurm"
    lost, train, new = rig.alloc_rows()
    assert lost.state is AllocState.LOST
    assert rig.reasons("alloc", lost.key)[-1] == ("HELD", "LOST", why)
    assert train.state is AllocState.HELD
    assert (new.role, new.pool, new.state, new.alloc_id) == ("rollout", "h20-1",
                                                             AllocState.HELD, "13")
    assert rig.reasons("alloc", new.key)[0] == (
        None, "WANTED", "replacement for a lost rollout allocation of 1 node(s)")
    assert rig.argvs("sbatch")[-1] == _sbatch("weave-gt1.1-h20-1", "h20")
    assert rig.reasons("group", 1)[-2:] == [
        ("ACTIVE", "FORMING", f"needs 1 more rollout node(s): {why}"),
        ("FORMING", "ACTIVE", "allocations ['12', '13'] held")]
    rollout_step = rig.store.steps(job_id=job, live_only=False)[0]
    assert rig.reasons("step", rollout_step.key)[-1] == (
        "RUNNING", "ENDED", "its allocation is gone")
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.state is JobState.RUNNING  # re-admitted by the driver
    assert fresh.reason == (f"{why}; asking for a new allocation, then re-admitting from "
                            "checkpoint")
    assert rig.argvs("scancel") == []


def test_both_allocations_vanishing_are_replaced_in_the_same_tick(rig: Rig) -> None:
    _running(rig)
    rig.slurm.vanish("11")
    rig.slurm.vanish("12")
    rig.tick(at=T0 + 10)
    assert [(a.pool, a.state) for a in rig.alloc_rows()] == [
        ("h20-0", AllocState.LOST), ("h800-0", AllocState.LOST),
        ("h20-1", AllocState.HELD), ("h800-1", AllocState.HELD)]
    assert rig.argvs("sbatch")[-2:] == [_sbatch("weave-gt1.1-h20-1", "h20"),
                                        _sbatch("weave-gt1.1-h800-1", "h800")]
    assert rig.reasons("group", 1)[-2:] == [
        ("ACTIVE", "FORMING", "needs 1 more rollout node(s): rollout allocation 11 "
                              "(node(s) h20-0) vanished from Slurm"),
        ("FORMING", "ACTIVE", "allocations ['13', '14'] held")]


# -- 4. failing commands -----------------------------------------------------------------


def test_a_failing_squeue_skips_the_tick_and_says_why_since_when(rig: Rig) -> None:
    job = _submit(rig.store)
    rig.slurm.squeue_reply = FakeReply(
        stderr="squeue: error: slurm_load_jobs error: Unable to contact slurm controller "
               "(connect failure)", returncode=1)
    with pytest.raises(SlurmCommandError, match="squeue --json"):
        rig.tick(at=T0 + 1)
    assert rig.rec.world_error == (T0 + 1, f"Slurm command failed: squeue --json --user={UID} "
                                   "(exit 1): squeue: error: slurm_load_jobs error: Unable to "
                                   "contact slurm controller (connect failure)")
    assert _job_state(rig.store, job) is JobState.PENDING  # nothing acted on a blind tick
    assert rig.rec.ticks == 0
    rig.slurm.squeue_reply = FakeReply(hang=True)
    with pytest.raises(SlurmCommandError):
        rig.tick(at=T0 + 40)
    assert rig.rec.world_error == (T0 + 1, "squeue hung: command timed out after 30 s and "
                                   "was killed")  # since the first failure
    rig.slurm.squeue_reply = None
    rig.tick(at=T0 + 45)
    assert rig.rec.world_error is None and rig.rec.ticks == 1
    assert _job_state(rig.store, job) is JobState.RUNNING
    rig.slurm.squeue_reply = FakeReply(hang=True)
    with pytest.raises(SlurmCommandError):
        rig.tick(at=T0 + 50)
    assert rig.rec.world_error is not None and rig.rec.world_error[0] == T0 + 50  # anew


def test_a_failing_sbatch_is_retried_with_doubling_backoff(rig: Rig) -> None:
    rig.slurm.refuse["weave-gt1.1-h20-0"] = FakeReply(
        stderr="sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
               "(job submit limit, user's size and/or time limits)",
        returncode=1)
    job = _submit(rig.store)
    asked: list[float] = []
    rig.slurm.hook = lambda argv: asked.append(rig.clock.now()) \
        if argv[:3] == _sbatch("weave-gt1.1-h20-0", "h20")[:3] else None
    for t in range(0, 92):
        rig.tick(at=T0 + t / 2)
    waits = [b - a for a, b in itertools.pairwise(asked)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert waits[0] == RETRY_FIRST_S and max(waits) == RETRY_MAX_S
    rollout = rig.alloc_rows()[0]
    said = ("rollout allocation weave-gt1.1-h20-0 not granted (sbatch weave-gt1.1-h20-0: not "
            "accepted now (retry later): sbatch: error: Batch job submission failed: Job "
            "violates accounting/QOS policy (job submit limit, user's size and/or time "
            "limits)); attempt 7, retrying in 15 s")
    assert rig.reasons("alloc", rollout.key)[-1] == ("ALLOCATING", "WANTED", said)
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.state is JobState.PLACED
    assert fresh.reason == f"waiting: {said}"
    assert _group(rig.store).state is GroupState.FORMING
    # the train allocation was granted once and is held, not asked for again
    assert rig.argvs("sbatch").count(_sbatch("weave-gt1.1-h800-0", "h800")) == 1
    del rig.slurm.refuse["weave-gt1.1-h20-0"]
    rig.tick(at=asked[-1] + 15)
    fresh = rig.store.job(job)
    assert fresh is not None and (fresh.state, fresh.reason) == (JobState.RUNNING, "")


def test_a_hung_sbatch_says_so(rig: Rig) -> None:
    rig.slurm.refuse["weave-gt1.1-h800-0"] = FakeReply(hang=True)
    _submit(rig.store)
    rig.tick()
    assert rig.reasons("alloc", 2)[-1] == (
        "ALLOCATING", "WANTED", "train allocation weave-gt1.1-h800-0 not granted (sbatch hung: "
        "command timed out after 30 s and was killed); attempt 1, retrying in 1 s")


def test_a_release_frees_nodes_so_waiting_allocations_ask_again_at_once(rig: Rig) -> None:
    first = _running(rig)
    rig.slurm.refuse["weave-gt1.2-h20-0"] = FakeReply(
        stderr="sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
               "(job submit limit, user's size and/or time limits)",
        returncode=1)
    _submit(rig.store, "b", rollout_s=50, slo=1.0)   # too slow for group 1: a group of its own
    rig.tick(at=T0 + 1)
    assert _group(rig.store, 2).plan.job_ids == (2,)
    assert rig.argvs("sbatch").count(_sbatch("weave-gt1.2-h20-0", "h20")) == 1
    rig.store.transition("job", first, JobState.CANCELLING, "cancelled by uid 1000", T0 + 1.5)
    rig.tick(at=T0 + 1.5)   # releases group 1: the retry wait is dropped
    del rig.slurm.refuse["weave-gt1.2-h20-0"]
    rig.tick(at=T0 + 1.6)
    assert rig.argvs("sbatch").count(_sbatch("weave-gt1.2-h20-0", "h20")) == 2
    assert _job_state(rig.store, 2) is JobState.RUNNING


def test_an_infeasible_sbatch_fails_the_job_and_releases_its_group(rig: Rig) -> None:
    rig.slurm.refuse["weave-gt1.1-h20-0"] = FakeReply(
        stderr="sbatch: error: Batch job submission failed: Requested node configuration "
               "is not available", returncode=1)
    job = _submit(rig.store)
    rig.tick()
    rollout, train = rig.alloc_rows()
    assert rollout.state is AllocState.FAILED and train.state is AllocState.RELEASED
    refused = ("sbatch weave-gt1.1-h20-0: Slurm refuses the request as asked: sbatch: error: "
               "Batch job submission failed: Requested node configuration is not available")
    assert rig.reasons("alloc", rollout.key)[-1] == ("ALLOCATING", "FAILED", refused)
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.state is JobState.FAILED
    assert fresh.reason == f"group 1: {refused}"
    assert [g[1:] for g in rig.reasons("group", 1)] == [
        ("FORMING", "new group for job(s) [1]"),
        ("DRAINING", f"its last member (job {job}) left"),
        ("RELEASED", "allocations released")]
    # the failed group's other allocation is never asked for
    assert rig.argvs("sbatch") == [_sbatch("weave-gt1.1-h20-0", "h20")]
    assert rig.reasons("alloc", train.key)[-1] == ("WANTED", "RELEASED", "not needed")
    assert rig.argvs("scancel") == []


# -- 5. what the comments promise --------------------------------------------------------


def test_pending_jobs_are_placed_as_one_batch_and_the_impossible_refused(rig: Rig) -> None:
    a, b = _submit(rig.store, "a"), _submit(rig.store, "b")
    never = _submit(rig.store, "c", rollout_state_gib=1e6)
    rig.tick()
    assert [g.group_id for g in rig.store.groups()] == [1]  # b joined a's new group
    assert _group(rig.store).plan.job_ids == (a, b)
    assert rig.reasons("job", a)[1] == ("PENDING", "PLACED", "new_group into group 1")
    assert rig.reasons("job", b)[1] == ("PENDING", "PLACED", "direct into group 1")
    refused = rig.store.job(never)
    assert refused is not None and refused.state is JobState.REFUSED
    assert refused.ended_s == T0
    assert rig.reasons("job", never)[1] == (
        "PENDING", "REFUSED", "job 3 not placed: rollout state 1000000.0 GiB per node exceeds "
        "the rollout nodes' host memory (2048 GiB)")
    assert len(rig.argvs("sbatch")) == 2  # one allocation per pool for the batch
    assert [_job_state(rig.store, j) for j in (a, b)] == [JobState.RUNNING] * 2


def test_a_job_cancelled_while_placement_decides_does_not_drop_the_ticks_placement(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A cancel between reading the pending jobs and writing their placement: the stale
    decision is not written (it used to fail as 'illegal JobState transition CANCELLED ->
    PLACED' and drop the whole tick's placement); the others are placed in the same tick,
    and a job cancelled before it was refused stays cancelled."""
    from weave_slurm.daemon import placing

    a, b = _submit(rig.store, "a"), _submit(rig.store, "b")
    never = _submit(rig.store, "c", rollout_state_gib=1e6)
    real, calls = placing.place_batch, []

    def racing(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:   # a user cancels while the batch is being decided
            for job in (b, never):
                rig.store.transition("job", job, JobState.CANCELLED, "cancelled by uid 1000",
                                     T0, expect=JobState.PENDING, ended_s=T0)
        return real(*args, **kw)

    monkeypatch.setattr(placing, "place_batch", racing)
    with caplog.at_level("INFO", logger="weave_slurm.daemon.placing"):
        rig.tick()
    assert len(calls) == 2 and _group(rig.store).plan.job_ids == (a,)
    assert _job_state(rig.store, a) is JobState.RUNNING
    assert [_job_state(rig.store, j) for j in (b, never)] == [JobState.CANCELLED] * 2
    assert "illegal" not in caplog.text and "placing the pending jobs again" in caplog.text


def test_a_job_over_its_users_running_limit_waits_saying_which_limit(rig: Rig) -> None:
    """limits.user.max_running = 1: alice's second job stays PENDING, its REASON naming
    the limit (as squeue's QOSMaxJobsPerUserLimit), and is placed once the first ended."""
    import dataclasses

    from weave_slurm.config.fairshare import JobLimits

    site = default_site()
    site = dataclasses.replace(site, limits=dataclasses.replace(
        site.limits, user=JobLimits(max_running=1)))
    rig.restart(site=site)
    a, b = _submit(rig.store, "a"), _submit(rig.store, "b")
    rig.tick()
    assert _job_state(rig.store, a) is JobState.RUNNING
    held = rig.store.job(b)
    assert held is not None and held.state is JobState.PENDING
    assert held.reason.startswith("held: user alice has 1 job placed or running") \
        and "QOSMaxJobsPerUserLimit" in held.reason
    rig.store.transition("job", a, JobState.CANCELLING, "t", T0)
    rig.store.transition("job", a, JobState.CANCELLED, "t", T0, ended_s=T0)
    rig.tick()
    assert _job_state(rig.store, b) in (JobState.PLACED, JobState.RUNNING)


def test_a_cancelled_job_has_its_steps_cancelled_then_its_group_released(rig: Rig) -> None:
    job = _running(rig)
    seen: list[tuple[str, str, list[str]]] = []
    rig.slurm.hook = lambda argv: seen.append(
        (argv[1], _job_state(rig.store, job).value,
         [s.state.value for s in rig.store.steps(live_only=False)]
         if "." in argv[1] else [a.state.value for a in rig.alloc_rows()]))
    rig.store.transition("job", job, JobState.CANCELLING, "cancelled by uid 1000", T0 + 1)
    rig.tick(at=T0 + 2)
    assert rig.argvs("scancel") == [("scancel", "11.0"), ("scancel", "12.0"),
                                    ("scancel", "11"), ("scancel", "12")]
    assert seen == [("11.0", "CANCELLING", ["STOPPING", "RUNNING"]),
                    ("12.0", "CANCELLING", ["ENDED", "STOPPING"]),
                    ("11", "CANCELLED", ["RELEASING", "HELD"]),
                    ("12", "CANCELLED", ["RELEASED", "RELEASING"])]
    assert rig.reasons("job", job)[-1] == ("CANCELLING", "CANCELLED", "cancelled by its owner")
    assert [s.state for s in rig.store.steps(live_only=False)] == [StepRunState.ENDED] * 2
    assert all(p.signals == [] for p in rig.fake.processes)  # srun exited by itself
    assert rig.reasons("group", 1)[-2:] == [
        ("ACTIVE", "DRAINING", f"its last member (job {job}) left"),
        ("DRAINING", "RELEASED", "allocations released")]
    assert [a.state for a in rig.alloc_rows()] == [AllocState.RELEASED] * 2
    assert rig.slurm.jobs == {}


def test_a_job_completes_when_its_last_step_exits_zero(rig: Rig) -> None:
    job = _running(rig)
    rig.fake.processes[0].returncode = 0
    rig.tick(at=T0 + 5)
    assert _job_state(rig.store, job) is JobState.RUNNING  # one step still runs
    rig.fake.processes[1].returncode = 0
    rig.tick(at=T0 + 6)
    assert rig.reasons("job", job)[-1] == (
        "RUNNING", "COMPLETED", "step weave-j1-h800-0 exited with code 0")
    assert _group(rig.store).state is GroupState.RELEASED


def test_a_step_that_fails_fails_its_job_and_stops_the_others(rig: Rig) -> None:
    job = _running(rig)
    rig.fake.processes[1].returncode = 2
    rig.tick(at=T0 + 5)
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.state is JobState.FAILED
    assert fresh.reason == "step weave-j1-h800-0 exited with code 2"
    assert rig.argvs("scancel") == [("scancel", "11.0"), ("scancel", "11"), ("scancel", "12")]


def _node_step(group: GroupRow, alloc: AllocRow, log_dir: Path | None = None) -> StepSpec:
    return StepSpec(name=NODE_STEP, argv=("weave-node", group.label, alloc.pool),
                    ntasks=alloc.node_count, node_count=alloc.node_count,
                    log_path=log_dir / f"node-{group.label}-{alloc.pool}.log" if log_dir else None)


NODE = ("--overlap", "--exact", "--job-name=weave-node", "-n", "1", "-c", "1", "-N", "1",
        "weave-node", "t1.1")


def test_node_daemons_gate_activation_and_a_dead_one_is_relaunched(rig: Rig) -> None:
    rec = rig.restart(node_step=_node_step)

    def no_srun(argv: tuple[str, ...]) -> None:  # the first node daemon of 12 cannot start
        if argv == ("srun", "--jobid=12", *NODE, "h800-0") and rec.ticks == 0:
            raise SlurmCommandError(argv, None, "", "cannot start 'srun': [Errno 24] Too "
                                    "many open files")

    rig.slurm.hook = no_srun
    job = _submit(rig.store)
    rig.tick()
    assert [c.argv for c in rig.fake.calls if c.spawned] == [
        ("srun", "--jobid=11", *NODE, "h20-0"), ("srun", "--jobid=12", *NODE, "h800-0")]
    assert rig.reasons("step", 2)[-1][:2] == ("LAUNCHING", "ENDED")
    assert "launch failed" in rig.reasons("step", 2)[-1][2]
    assert _group(rig.store).state is GroupState.FORMING   # not every node daemon runs
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.state is JobState.PLACED
    assert fresh.reason.startswith("node daemon of train allocation 12 (h800-0) could not be "
                                   "launched (Slurm command failed: srun --jobid=12")
    assert fresh.reason.endswith("Too many open files); failure 1 of 5, relaunching in 1 s")
    rig.tick(at=T0 + 1)   # after the backoff's first wait
    assert [c.argv for c in rig.fake.calls if c.spawned][2:] == [
        ("srun", "--jobid=12", *NODE, "h800-0"), _srun("11", "weave-j1-h20-0", "h20-0"),
        _srun("12", "weave-j1-h800-0", "h800-0")]
    assert rig.reasons("group", 1)[-1] == ("FORMING", "ACTIVE", "allocations ['11', '12'] held")
    fresh = rig.store.job(job)
    assert fresh is not None and (fresh.state, fresh.reason) == (JobState.RUNNING, "")
    # the rollout node daemon dies while Slurm still lists its step: cancelled, relaunched
    # after the first wait (not in the same tick), and its job says so meanwhile
    rig.fake.processes[0].returncode = 1
    rig.tick(at=T0 + 5)
    assert rig.argvs("scancel") == [("scancel", "11.0")]
    assert [c.argv for c in rig.fake.calls if c.spawned][5:] == []
    said = ("node daemon of rollout allocation 11 (h20-0) exited with code 1; "
            "failure 1 of 5, relaunching in 1 s")
    fresh = rig.store.job(job)
    assert fresh is not None and (fresh.state, fresh.reason) == (JobState.RUNNING, said)
    rig.tick(at=T0 + 6)
    assert [c.argv for c in rig.fake.calls if c.spawned][5:] == [
        ("srun", "--jobid=11", *NODE, "h20-0")]
    assert [s.name for s in rig.store.steps(alloc_key=1)] == ["weave-j1-h20-0", NODE_STEP]
    assert _job_state(rig.store, job) is JobState.RUNNING and rec.ticks == 4
    # once it has run NODE_DAEMON_STABLE_S, the reason is cleared and its failures forgotten
    rig.tick(at=T0 + 6 + NODE_DAEMON_STABLE_S - 1)
    fresh = rig.store.job(job)
    assert fresh is not None and fresh.reason == said
    rig.tick(at=T0 + 6 + NODE_DAEMON_STABLE_S)
    fresh = rig.store.job(job)
    assert fresh is not None and (fresh.state, fresh.reason) == (JobState.RUNNING, "")
    assert not rec.node_retries.failing(1)


SHM_TAKEN = ("weave node serve: error: shm root /dev/shm/weave-nodes/h20-0 is held by "
             "another node daemon (pid 4242); stop it or use another --root")


def test_a_node_daemon_that_keeps_failing_backs_off_says_why_then_fails_its_jobs(
        rig: Rig, tmp_path: Path) -> None:
    rec = rig.restart(node_step=lambda g, a: _node_step(g, a, tmp_path))
    job = _submit(rig.store)
    rig.tick()
    assert _job_state(rig.store, job) is JobState.RUNNING   # node daemons 11.0 and 12.0 up
    log_file = tmp_path / "node-t1.1-h20-0.log"

    def dies_at_once(argv: tuple[str, ...]) -> None:   # what the step writes to its log
        if argv[:2] == ("srun", "--jobid=11") and argv[4] == "--job-name=weave-node":
            with log_file.open("a") as fh:
                fh.write(f"{SHM_TAKEN}\nsrun: error: h20-0: task 0: Exited with exit code 1\n")

    rig.slurm.hook = dies_at_once
    rig.slurm.exits[("11", NODE_STEP)] = 1   # every relaunch exits at once
    log_file.write_text("weave node serve: serving on h20-0\n")  # the first one's line
    dies_at_once(("srun", "--jobid=11", "", "", "--job-name=weave-node"))
    rig.slurm.exit_step("11.0", 1)
    seen: list[tuple[float, JobState, str]] = []
    for t in range(10, 80):   # every 0.5 s of the virtual clock
        rig.tick(at=T0 + t / 2)
        fresh = rig.store.job(job)
        assert fresh is not None
        if not seen or seen[-1][1:] != (fresh.state, fresh.reason):
            seen.append((rig.clock.now() - T0, fresh.state, fresh.reason))
    rows = [s for s in rig.store.steps(alloc_key=1, live_only=False) if s.job_id is None]
    spans = [(rig.store.transitions("step", r.key)[0].ts,
              rig.store.transitions("step", r.key)[-1].ts) for r in rows]
    waits = [nxt[0] - end for (_, end), nxt in itertools.pairwise(spans)]
    assert waits == [1.0, 2.0, 4.0, 8.0]   # from each failure to the next launch
    assert len(rows) == NODE_DAEMON_TRIES
    head = f"node daemon of rollout allocation 11 (h20-0) exited with code 1: {SHM_TAKEN}"
    assert seen == [
        (5.0, JobState.RUNNING, f"{head}; failure 1 of 5, relaunching in 1 s"),
        (6.5, JobState.RUNNING, f"{head}; failure 2 of 5, relaunching in 2 s"),
        (9.0, JobState.RUNNING, f"{head}; failure 3 of 5, relaunching in 4 s"),
        (13.5, JobState.RUNNING, f"{head}; failure 4 of 5, relaunching in 8 s"),
        (22.0, JobState.FAILED, f"{head}; gave up after 5 failures in a row (log: "
                                f"{log_file})")]
    # the job's steps were stopped, its group released; the train node daemon never relaunched
    assert rig.argvs("scancel") == [("scancel", "11.1"), ("scancel", "12.1"),
                                    ("scancel", "11"), ("scancel", "12")]
    assert rig.argvs("srun").count(("srun", "--jobid=12", *NODE, "h800-0")) == 1
    assert _group(rig.store).state is GroupState.RELEASED
    assert rig.slurm.jobs == {} and rec.ticks == 71


# -- 6. rollout scaling and shrinking ----------------------------------------------------

#: Two such jobs never share a rollout node (2048 GiB of host memory a node): a second one
#: joins the first's group on a node of its own (rollout scaling) as their training fits.
BIG = {"rollout_state_gib": 1500.0}


class _HoldingDriver(IdleDriver):
    """An idle driver that says it still uses the nodes in ``held`` (as the group
    runtime does until its members have moved off them)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    def in_use(self, group_id: int) -> frozenset[str]:
        return frozenset(self.held)


def _pins(rig: Rig) -> dict[int, tuple[int, ...]]:
    return {m.job_id: m.rollout_pins for m in _group(rig.store).plan.members}


def test_a_pooled_plan_asks_for_a_gpu_share_of_a_node(rig: Rig) -> None:
    """A plan with ``rollout_gpus`` (a pooled group) asks for its next rollout row as a
    share: 4 of the node's 8 GPUs and CPUs in proportion, never --exclusive."""
    a = _running(rig)
    plan = _group(rig.store).plan
    rig.store.update("group", 1, plan=GroupPlan(
        plan.rollout_nodes, plan.train_nodes, (*plan.members, MemberPlan(9, (1,))),
        rollout_gpus=4).to_json())
    before = len(rig.fake.calls)
    rig.tick(at=T0 + 1)
    (options,) = rig.argvs("sbatch", before)
    assert options[4:] == ("--partition=h20", "--nodes=1", "--ntasks-per-node=1",
                           "--cpus-per-task=1", "--gres=gpu:h20:4")
    assert not any("exclusive" in o for o in options)
    row = rig.alloc_rows()[-1]
    assert (row.role, row.gpus_per_node, row.cpus_per_node) == ("rollout", 4, 1)
    assert rig.reasons("alloc", row.key)[0][2] == \
        "rollout scaling: extra rollout allocation of 1 node(s), 4 GPUs of each"
    assert _pins(rig)[a] == (0,)


def test_rollout_scaling_asks_for_exactly_one_more_allocation(rig: Rig) -> None:
    a = _running(rig, **BIG)
    before = len(rig.fake.calls)
    b = _submit(rig.store, "b", **BIG)
    rig.tick(at=T0 + 1)
    assert rig.reasons("job", b)[1] == ("PENDING", "PLACED", "scale_rollout into group 1")
    assert rig.argvs("sbatch", before) == [_sbatch("weave-gt1.1-h20-1", "h20")]
    assert rig.reasons("alloc", 3)[0] == (
        None, "WANTED", "rollout scaling: extra rollout allocation of 1 node(s)")
    assert rig.reasons("group", 1)[-2:] == [
        ("ACTIVE", "FORMING", "needs 1 more rollout node(s)"),
        ("FORMING", "ACTIVE", "allocations ['11', '12', '13'] held")]
    # b's pin names the new node; a's steps are left alone
    assert _pins(rig) == {a: (0,), b: (1,)}
    assert [c.argv for c in rig.fake.calls[before:] if c.spawned] == [
        _srun("12", "weave-j2-h800-0", "h800-0"), _srun("13", "weave-j2-h20-1", "h20-1")]
    assert rig.argvs("scancel") == []
    assert [_job_state(rig.store, j) for j in (a, b)] == [JobState.RUNNING] * 2
    # nothing more is asked for, by this daemon or by the next one on the same store
    mark = len(rig.fake.calls)
    rig.tick(at=T0 + 2)
    rig.restart()
    rig.tick(at=T0 + 3)
    assert rig.argvs("sbatch", mark) == [] and rig.argvs("scancel", mark) == []
    assert [(a.state, a.alloc_id) for a in rig.alloc_rows()] == [
        (AllocState.HELD, "11"), (AllocState.HELD, "12"), (AllocState.HELD, "13")]


def test_a_shrunk_group_returns_exactly_the_allocation_nobody_is_pinned_to(
        rig: Rig) -> None:
    rig.restart(driver=_HoldingDriver())
    a = _running(rig, **BIG)
    b = _submit(rig.store, "b", **BIG)
    rig.tick(at=T0 + 1)
    assert _pins(rig) == {a: (0,), b: (1,)}
    holding = rig.rec.driver
    assert isinstance(holding, _HoldingDriver)
    holding.held = {"h20-1"}   # the runtime has not let go of b's node yet
    for proc in rig.fake.processes[2:4]:   # b's steps end well
        proc.returncode = 0
    rig.tick(at=T0 + 5)
    assert _job_state(rig.store, b) is JobState.COMPLETED
    assert _pins(rig) == {a: (0,)}
    assert rig.argvs("scancel") == []   # its node is still in use
    holding.held = set()
    rig.tick(at=T0 + 6)
    assert rig.argvs("scancel") == [("scancel", "13")]
    assert [(r.pool, r.state) for r in rig.alloc_rows()] == [
        ("h20-0", AllocState.HELD), ("h800-0", AllocState.HELD),
        ("h20-1", AllocState.RELEASED)]
    assert rig.reasons("alloc", 3)[-2:] == [
        ("HELD", "RELEASING", "releasing 13: no member of group 1 is pinned to its node(s) "
                              "h20-1 any more"),
        ("RELEASING", "RELEASED", "released")]
    assert _group(rig.store).state is GroupState.ACTIVE
    assert _job_state(rig.store, a) is JobState.RUNNING
    assert [s.state for s in rig.store.steps(job_id=a)] == [StepRunState.RUNNING] * 2
    mark = len(rig.fake.calls)
    rig.tick(at=T0 + 7)
    assert rig.argvs("sbatch", mark) == [] and rig.argvs("scancel", mark) == []


def test_the_first_member_leaving_returns_its_allocation_and_the_other_stays(
        rig: Rig) -> None:
    """A pin names a node for good: when a (on the group's first allocation) leaves, b
    keeps its node h20-1 and the allocation of h20-0 is the one returned."""
    a = _running(rig, **BIG)
    b = _submit(rig.store, "b", **BIG)
    rig.tick(at=T0 + 1)
    for proc in rig.fake.processes[:2]:   # a's steps end well
        proc.returncode = 0
    rig.tick(at=T0 + 5)
    assert _job_state(rig.store, a) is JobState.COMPLETED
    assert _pins(rig) == {b: (1,)}
    assert rig.argvs("scancel") == [("scancel", "11")]
    assert [r.state for r in rig.alloc_rows()] == [
        AllocState.RELEASED, AllocState.HELD, AllocState.HELD]
    assert [s.name for s in rig.store.steps(job_id=b)] == ["weave-j2-h800-0", "weave-j2-h20-1"]
    mark = len(rig.fake.calls)
    rig.tick(at=T0 + 6)
    assert rig.argvs("sbatch", mark) == [] and rig.argvs("scancel", mark) == []


def test_a_newcomer_that_leaves_before_its_allocation_came_asks_no_more(
        rig: Rig) -> None:
    a = _running(rig, **BIG)
    rig.slurm.refuse["weave-gt1.1-h20-1"] = FakeReply(
        stderr="sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
               "(job submit limit, user's size and/or time limits)",
        returncode=1)
    b = _submit(rig.store, "b", **BIG)
    rig.tick(at=T0 + 1)
    assert _group(rig.store).state is GroupState.FORMING
    rig.store.transition("job", b, JobState.CANCELLING, "cancelled by uid 1000", T0 + 1.5)
    rig.tick(at=T0 + 10)
    assert rig.argvs("sbatch").count(_sbatch("weave-gt1.1-h20-1", "h20")) == 1
    assert rig.reasons("alloc", 3)[-1] == (
        "WANTED", "RELEASED", "no member of group 1 is pinned to its node(s) - any more")
    assert rig.reasons("group", 1)[-1] == ("FORMING", "ACTIVE",
                                           "allocations ['11', '12'] held")
    assert _pins(rig) == {a: (0,)} and _job_state(rig.store, a) is JobState.RUNNING


def test_a_lost_allocation_of_a_scaled_group_is_replaced_under_the_same_pins(
        rig: Rig) -> None:
    """The first rollout allocation vanishes: its member moves to the replacement's
    slot, the scaled-in member keeps its node."""
    a = _running(rig, **BIG)
    b = _submit(rig.store, "b", **BIG)
    rig.tick(at=T0 + 1)
    rig.slurm.vanish("11")
    mark = len(rig.fake.calls)
    rig.tick(at=T0 + 5)
    assert rig.argvs("sbatch", mark) == [_sbatch("weave-gt1.1-h20-2", "h20")]
    assert rig.reasons("alloc", 4)[0] == (
        None, "WANTED", "replacement for a lost rollout allocation of 1 node(s)")
    assert _pins(rig) == {a: (2,), b: (1,)}
    assert [(r.pool, r.state, r.nodes) for r in rig.alloc_rows()] == [
        ("h20-0", AllocState.LOST, ("h20-0",)), ("h800-0", AllocState.HELD, ("h800-0",)),
        ("h20-1", AllocState.HELD, ("h20-1",)), ("h20-2", AllocState.HELD, ("h20-2",))]
    assert rig.argvs("scancel", mark) == []
    assert [_job_state(rig.store, j) for j in (a, b)] == [JobState.RUNNING] * 2


def _row(key: int, nodes: tuple[str, ...], state: AllocState = AllocState.HELD) -> AllocRow:
    return AllocRow(key, 1, "rollout", f"h20-{key}", "h20", len(nodes), 8, "h20", 2, state,
                    str(10 + key), nodes, "")


def _plan(**pins: tuple[int, ...]) -> GroupPlan:
    return GroupPlan(len({p for ps in pins.values() for p in ps}), 1,
                     tuple(MemberPlan(int(j[1:]), ps) for j, ps in pins.items()))


def _model(**pins: tuple[int, ...]) -> Group:
    profile = simple_profile("x", 10, 10, 1.5)
    members = tuple(Member(profile.with_id(j[1:]), ps) for j, ps in pins.items())
    return Group(1, members, len({p for ps in pins.values() for p in ps}), 1)


def _rollout_wants(plan: GroupPlan, rows: list[AllocRow]) -> list[allocplan.Want]:
    return [w for w in allocplan.needs(plan, rows).wants if w.role == "rollout"]


def test_placement_renumbering_moves_only_the_members_placement_moved() -> None:
    """Placement numbers a group's nodes afresh (a re-pin from scratch, a compaction
    after a departure); the stored pins keep naming the nodes the members are on."""
    rows = [_row(1, ("h20-0",)), _row(3, ("h20-1",)), _row(4, ("h20-2",))]
    before = _plan(j1=(0,), j2=(1,), j3=(2,))
    # j1 left; placement compacted j2 and j3 onto one node (its index 0): the member
    # that was there first (j2, by slot) stays, j3 moves to it; two allocations unneeded
    after = membership.plan_of(_model(j2=(0,), j3=(0,)), before, rows)
    assert {m.job_id: m.rollout_pins for m in after.members} == {2: (1,), 3: (1,)}
    assert [r.key for r in allocplan.needs(after, rows).surplus] == [1, 4]
    # an arrival re-pinned the group from scratch, numbering its nodes in another order:
    # nobody moves, the newcomer shares j1's node
    renumbered = membership.plan_of(_model(j2=(0,), j1=(1,), j9=(1,)), _plan(j1=(0,), j2=(1,)),
                                    rows[:2])
    assert {m.job_id: m.rollout_pins for m in renumbered.members} == {2: (1,), 1: (0,),
                                                                       9: (0,)}
    # rollout scaling: the new node is the next slot, after an idle held one is used
    two = [_row(1, ("h20-0", "h20-1"))]
    assert membership.node_slots(_plan(j1=(0,)), two) == (0, 1)
    scaled = membership.plan_of(_model(j1=(0,), j8=(1,), j9=(2,)), _plan(j1=(0,)), two)
    assert {m.job_id: m.rollout_pins for m in scaled.members} == {1: (0,), 8: (1,), 9: (2,)}
    assert _rollout_wants(scaled, two) == [allocplan.Want("rollout", 1)]


def test_a_lost_slot_moves_to_the_replacement_and_later_slots_keep_their_numbers() -> None:
    rows = [_row(1, ("h20-0",), AllocState.LOST), _row(3, ("h20-1",))]
    plan = _plan(j1=(0,), j2=(1,))
    needs = allocplan.needs(plan, rows)
    assert {m.job_id: m.rollout_pins for m in needs.plan.members} == {1: (2,), 2: (1,)}
    assert _rollout_wants(plan, rows) == [allocplan.Want("rollout", 1, replaces=True)]
    assert allocplan.needs(needs.plan, rows).plan == needs.plan   # idempotent
    held = [*rows, _row(5, ("h20-7",))]
    assert allocplan.held_nodes(held) == {1: (held[1], "h20-1"), 2: (held[2], "h20-7")}
    assert _rollout_wants(needs.plan, held) == []


class _BrokenDriver(IdleDriver):
    """An idle driver whose per-tick drive fails (a bug in the runtime)."""

    def drive(self, store: Store, now: float) -> list[JobOutcome]:
        raise RuntimeError("driver bug")


def test_a_failing_act_is_logged_and_the_others_still_run(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.restart(driver=_BrokenDriver())
    job = _submit(rig.store)
    rig.tick()
    assert "unexpected error" in caplog.text
    assert _job_state(rig.store, job) is JobState.RUNNING and rig.rec.ticks == 1
