"""Three poolable jobs in one pooled group, widened for a fourth, through a running
weaved (issue 34; the site's ``[limits] rollout = "pooled"``, daemon/pooling.py), on any
backend (the test: tests/daemon/test_weaved_pooled_slurm.py, on the Slurm cluster of
separate hosts; the local backend's shares: tests/runtime/test_weaved_shares.py).

The three are placed in one pooled group, which holds GPU shares of rollout nodes rather
than the nodes; each member's rollout runs as one engine per ``ENGINE_GPUS`` GPUs of the
pool, over all of it. A fourth, with a longer rollout, arrives mid-run and the pool
widens: a new row of shares beside the first, the members re-pinned onto it at their
phase boundaries. Each job ends with its solo run's weights (a one-engine run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.harness import weaved
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.waits import wait_for
from weave_slurm.config.render import OptionInput, job_spec_toml
from weave_slurm.daemon import pooling
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.records import AllocRow, GroupPlan
from weave_slurm.daemon.service import Weaved
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

STEPS = 8
#: The jobs: a batch that does not depend on the engine count (they are pooled).
POOLED: dict[str, OptionInput] = {**OPTIONS, "sampling": "per_prompt"}
#: GPUs of each engine (``[gpus] engine``): a pool of 12 GPUs is 12 engines a member.
ENGINE_GPUS = 1
#: The site's part for pools (a member's layout's every engine and rank is started).
SITE = """
[pools.rollout]
[pools.train]
[limits]
rollout = "pooled"
[runtime]
gangs = true
plan_from_measurements = false
"""


@dataclass(frozen=True)
class Widened:
    """What the scenario saw: the jobs (id -> seed), the fourth, the group, its plans
    before and after the fourth joined and its rollout rows after."""

    seeds: dict[int, int]
    steps: dict[int, int]
    fourth: int
    group: int
    before: GroupPlan
    after: GroupPlan
    rows: tuple[AllocRow, ...]


def _submit(sock: Path, k: int, seed: int, steps: int, rollout_gpu_s: float = 60.0,
            hold: bool = False) -> int:
    """Job ``k``: one engine of ``ENGINE_GPUS`` GPUs, its rollout ``rollout_gpu_s``
    GPU-seconds as declared; ``hold``: submitted held (``[slurm] hold``)."""
    spec = job_spec_toml(f"p{k}", iterations=steps, seed=seed, options=POOLED,
                         rollout_gpus=ENGINE_GPUS, engine_gpus=ENGINE_GPUS,
                         rollout_s=rollout_gpu_s / ENGINE_GPUS, train_s=10.0, slo=2.0)
    if hold:
        spec += "\n[slurm]\nhold = true\n"
    return int(weaved.call(sock, Op.SUBMIT, spec=spec, source=f"p{k}.toml")["job"])


def _at_version(w: Weaved, jobs: list[int], what: str) -> None:
    """Until each of ``jobs`` is at version 1 (on timeout: each one's state and reason)."""
    def seen() -> list[tuple[int, str, str]]:
        return [(-1 if (live := w.driver.live(r["job"])) is None else live["version"],
                 r["state"], r["reason"])
                for r in weaved.call(w.config.socket, Op.STATUS, jobs=jobs)["jobs"]]
    try:
        wait_for(seen, 240, what, interval_s=0.3,
                 until=lambda rows: all(v >= 1 for v, *_ in rows))
    except AssertionError as exc:   # what weaved planned and held, for the reader
        plans = [(g.group_id, g.plan) for g in w.store.groups(live_only=False)]
        rows = [(a.key, a.group_id, a.pool, a.gpus_per_node, a.nodes, a.state.value,
                 a.alloc_id) for a in w.store.allocs(live_only=False)]
        raise AssertionError(f"{exc}; plans {plans}; allocations {rows}") from None


def widen_for_a_fourth(w: Weaved, sock: Path, seed: int, steps: int = STEPS,
                       fourth_steps: int = STEPS) -> Widened:
    """Three jobs (seeds ``seed``, +1, +2; ``steps`` each: enough that they outlive the
    fourth's arrival) pooled in one group; a fourth (+3, ``fourth_steps``: more where a
    test must catch one of its short phases running), with a rollout eight times
    longer, joins it and the pool widens. Returns once the fourth is at version 1 (the
    others still running)."""
    seeds = {_submit(sock, k, seed + k, steps, hold=True): seed + k for k in range(3)}
    first = list(seeds)   # released together: placed in one tick, as one pool
    assert all(r["ok"] for r in weaved.call(sock, Op.RELEASE, jobs=first)["results"])
    _at_version(w, first, "three jobs at version 1")
    (group,) = w.store.groups()
    before = group.plan
    assert before.rollout_gpus is not None and set(before.job_ids) == set(first), before
    assert all(m.rollout_pins == before.members[0].rollout_pins for m in before.members)
    fourth = _submit(sock, 3, seed + 3, fourth_steps, rollout_gpu_s=480.0)   # a wider pool
    seeds[fourth] = seed + 3
    after = wait_for(lambda: w.store.groups()[0].plan, 60, f"job {fourth} placed in the pool",
                     interval_s=0.2, until=lambda plan: fourth in plan.job_ids)
    states = {r["job"]: r["state"] for r in weaved.call(sock, Op.STATUS, jobs=first)["jobs"]}
    assert set(states.values()) == {"RUNNING"}, states   # the width changes mid-run
    assert len(after.members) == 4, after
    allocs = w.store.allocs(group.group_id, live_only=False)
    assert pooling.width(after, allocs) > pooling.width(before, allocs), (before, after)
    _at_version(w, [fourth], f"job {fourth} at version 1")
    allocs = w.store.allocs(group.group_id, live_only=False)
    rows = tuple(a for a in allocs if a.role == "rollout")
    return Widened(seeds, {**{j: steps for j in first}, fourth: fourth_steps}, fourth,
                   group.group_id, before, after, rows)


def end_as_solo(w: Weaved, sock: Path, run: Widened, timeout_s: float = 300) -> None:
    """Every job COMPLETED with its solo run's weights; the group held shares (no
    whole node), the first row and the one the fourth added."""
    rows = weaved.wait_states(sock, list(run.seeds), {"COMPLETED", "FAILED"}, timeout_s, [])
    assert [r["state"] for r in rows] == ["COMPLETED"] * 4, rows
    shares = [a for a in w.store.allocs(run.group, live_only=False) if a.role == "rollout"]
    assert all(a.gpus_per_node < 8 for a in shares), shares   # shares, not nodes
    assert len(shares) >= 2, shares   # the first row and the one the fourth added
    _each_as_solo(w, run.seeds, run.steps)


def _each_as_solo(w: Weaved, seeds: dict[int, int], steps: dict[int, int]) -> None:
    """Each job's final weights are its solo run's (job -> seed, job -> steps)."""
    for j, seed in seeds.items():
        solo = run_solo(MemberSpec(str(j), seed=seed, steps=steps[j], options=POOLED))
        live = w.driver.live(j)
        assert live is not None and live["weights_sha256"] == weights_digest(solo.weights)


@dataclass(frozen=True)
class Narrowed:
    """What the narrowing scenario saw: the jobs (id -> seed, steps), the group and the
    rollout row that gave a node back."""

    seeds: dict[int, int]
    steps: dict[int, int]
    group: int
    row: AllocRow


def narrow_after_a_departure(w: Weaved, sock: Path, seed: int, steps: int = 120,
                             short: int = 4) -> Narrowed:
    """Two jobs pooled in one group striped over both rollout hosts: one whose rollout
    is declared long (the pool is wide) and of ``short`` steps, one whose rollout is
    declared short (alone it needs a few GPUs) and of ``steps`` (it takes more turns:
    enough steps to outlive the first). Once the first completes, the pool narrows to
    what the other needs alone and gives back a node of its row (daemon/allocplan.py
    "Spare nodes"). Returns once weaved wrote the node given back (the other still
    running)."""
    wide = _submit(sock, 0, seed, short, hold=True)
    narrow = _submit(sock, 1, seed + 1, steps, rollout_gpu_s=5.0, hold=True)
    assert all(r["ok"] for r in weaved.call(sock, Op.RELEASE, jobs=[wide, narrow])["results"])
    _at_version(w, [wide, narrow], "two jobs at version 1")
    (group,) = w.store.groups()
    assert group.plan.rollout_gpus is not None and set(group.plan.job_ids) == {wide, narrow}
    weaved.wait_states(sock, [wide], {"COMPLETED"}, 120, [])

    plans: list[GroupPlan] = []

    def rows() -> list[AllocRow]:
        now = w.store.group(group.group_id)
        if now is not None and (not plans or plans[-1] != now.plan):
            plans.append(now.plan)
        return [a for a in w.store.allocs(group.group_id) if a.role == "rollout" and a.gone]

    try:
        (row,) = wait_for(rows, 60, "a node of the pool given back", interval_s=0.1,
                          until=bool)
    except AssertionError as exc:   # what weaved planned and held, for the reader
        held = [(a.key, a.gpus_per_node, a.nodes, a.gone, a.state.value, a.reason)
                for a in w.store.allocs(group.group_id, live_only=False)]
        raise AssertionError(f"{exc}; plans {plans}; rows {held}") from None
    assert weaved.state_of(sock, narrow) == "RUNNING"   # given back while it runs
    return Narrowed({wide: seed, narrow: seed + 1}, {wide: short, narrow: steps},
                    group.group_id, row)


def end_narrowed_as_solo(w: Weaved, sock: Path, run: Narrowed, timeout_s: float = 300) -> None:
    """Both jobs COMPLETED with their solo run's weights."""
    rows = weaved.wait_states(sock, list(run.seeds), {"COMPLETED", "FAILED"}, timeout_s, [])
    assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
    _each_as_solo(w, run.seeds, run.steps)



@dataclass(frozen=True)
class Admitted:
    """What the admission scenario saw: the jobs (id -> seed, steps), the wide pool's
    group, the width it held before the second job came and its rollout row once it
    gave a node back, and the second's group and rollout rows."""

    seeds: dict[int, int]
    steps: dict[int, int]
    wide: int
    was: int
    row: AllocRow
    second: int
    second_rows: tuple[AllocRow, ...]


def narrow_to_admit(w: Weaved, sock: Path, seed: int, steps: int = 160,
                    second_steps: int = 6) -> Admitted:
    """A job alone in a pool as wide as the rollout partition (its rollout declared
    long: widening it is the cheapest per unit of work), and a second job that cannot
    join it (the site's ``max_group_size = 1``): weaved narrows the first pool to the
    whole nodes it keeps and gives the others back while the first runs, and the
    second's pool is granted on them (daemon/room.py). Returns once the second is at
    version 1."""
    first = _submit(sock, 0, seed, steps, rollout_gpu_s=480.0)
    _at_version(w, [first], "the first job at version 1")
    (group,) = w.store.groups()
    gid = group.group_id
    was = pooling.width(group.plan, w.store.allocs(gid, live_only=False))
    second = _submit(sock, 1, seed + 1, second_steps)

    def width() -> int:
        now = w.store.group(gid)
        assert now is not None, f"group {gid} gone"
        return pooling.width(now.plan, w.store.allocs(gid, live_only=False))
    wait_for(width, 60, f"group {gid}'s pool narrowed for job {second}", interval_s=0.1,
             until=lambda gpus: gpus < was)
    assert weaved.state_of(sock, first) == "RUNNING"   # narrowed while it runs
    (row,) = wait_for(lambda: [a for a in w.store.allocs(gid) if a.role == "rollout"
                               and a.gone], 90, f"group {gid}'s pool giving a node back",
                      interval_s=0.1, until=bool)
    assert weaved.state_of(sock, first) == "RUNNING"   # given back while it runs
    _at_version(w, [second], f"job {second} at version 1 beside the narrowed pool")
    job = w.store.job(second)
    assert job is not None and job.group_id is not None, job
    rows = tuple(a for a in w.store.allocs(job.group_id, live_only=False)
                 if a.role == "rollout")
    return Admitted({first: seed, second: seed + 1}, {first: steps, second: second_steps},
                    gid, was, row, job.group_id, rows)


def end_admitted_as_solo(w: Weaved, sock: Path, run: Admitted, timeout_s: float = 300) -> None:
    """Both jobs COMPLETED with their solo run's weights; the first pool held both
    rollout nodes and gave one back, on which the second's pool was granted."""
    assert run.was == 16, run   # both rollout nodes, 8 GPUs of each
    assert len(run.row.nodes) == 2 and len(run.row.gone) == 1, run.row
    assert [(a.nodes, a.gpus_per_node) for a in run.second_rows] == [(run.row.gone, 8)], run
    rows = weaved.wait_states(sock, list(run.seeds), {"COMPLETED", "FAILED"}, timeout_s, [])
    assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
    _each_as_solo(w, run.seeds, run.steps)
