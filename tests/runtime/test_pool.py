"""A pooled member (runtime/pool.py, pure): its rollout layout derived from the group's
pool GPUs on its pins, the refusals of a pool that does not fit or of a job whose batch
depends on its engine count, its engines placed over the pool, and the slices a
training step merges when its width changed after the rollout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.specs import OPTIONS
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.node.index import JobRef
from weave_slurm.runtime.gang import Gang, RankSlot
from weave_slurm.runtime.group import MemberSpec, NodeRef
from weave_slurm.runtime.launch_plan import LaunchPlan
from weave_slurm.runtime.member import RunningMember
from weave_slurm.runtime.pool import pool_layout
from weave_slurm.vocab import Phase, Pool

PER_PROMPT = {**OPTIONS, "sampling": "per_prompt"}
ROLLOUT = tuple(NodeRef(f"h20-{i}", Pool.ROLLOUT, Path(f"/nonexistent/r{i}.sock"))
                for i in range(3))


def _tp(t: int) -> MemberLayout:
    """One training rank, one engine of ``t`` GPUs (the stored layout's T)."""
    return MemberLayout(TrainLayout((1,)), RolloutLayout(t, (1,)))


def test_pool_layout_puts_g_over_t_engines_on_each_pin() -> None:
    assert pool_layout("m", (4, 2), 2) == RolloutLayout(2, (2, 1))
    assert pool_layout("m", (1,), 1) == RolloutLayout(1, (1,))
    assert pool_layout("m", (8, 8, 4), 4).engines == 5


@pytest.mark.parametrize("pool", [(1, 2), (3,), (4, 5), (), (2, True), (0,)])
def test_pool_layout_refuses_a_pin_the_engines_do_not_fill(pool: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        pool_layout("member 'p'", pool, 2 if pool != (0,) else 1)
    words = str(err.value)
    assert words.startswith(f"member 'p': pool={list(pool)!r} with ") and "\n" not in words
    assert "valid: one entry per pin, each a multiple of" in words


def test_a_pooled_member_derives_its_engines_from_its_pool() -> None:
    """Its stored layout says 1 engine of 2 GPUs; its pool of 4 + 2 GPUs gives 3 such
    engines, 2 on its first pin and 1 on its second; training stays as stored."""
    spec = MemberSpec("p", options=PER_PROMPT, rollout_pins=(2, 0), pool=(4, 2),
                      layout=_tp(2))
    spec.validate(rollout_nodes=3, train_nodes=1)
    assert spec.rollout_layout == RolloutLayout(2, (2, 1))
    assert spec.placed_engines() == ((2, range(0, 2)), (0, range(2, 3)))
    assert [spec.gpus_on(Phase.ROLLOUT, i) for i in (0, 1)] == [4, 2]
    assert spec.placed_ranks() == ((0, range(1)),)
    engines = Gang.engines_of(spec, JobRef("p", 0), ROLLOUT)
    assert [(s.rank, s.local_rank, s.node.name, s.job.job_id) for s in engines.slots] == [
        (0, 0, "h20-2", "p"), (1, 1, "h20-2", "p.e1"), (2, 0, "h20-0", "p.e2")]
    # not pooled: the stored layout's one engine, on the first pin only
    plain = MemberSpec("p", options=PER_PROMPT, rollout_pins=(2,), layout=_tp(2))
    assert plain.rollout_layout == RolloutLayout(2, (1,))
    # no stored layout: one GPU per engine, one engine per pool GPU
    bare = MemberSpec("q", options=PER_PROMPT, rollout_pins=(0, 1), pool=(2, 2))
    assert Gang.engines_of(bare, JobRef("q", 0), ROLLOUT).size == 4


@pytest.mark.parametrize(("changes", "words"), [
    ({"pool": (2,)}, "pool=[2] names 1 pin(s) but rollout_pins=[0, 1] has 2; valid: one "
                     "entry per pin, in pin order"),
    ({"pool": (2, 3)}, "pool=[2, 3] with 2 GPU(s) per engine; valid: one entry per pin, "
                       "each a multiple of 2 GPU(s) (2, 4, 6, ...)"),
    ({"pool": (1, 2)}, "pool=[1, 2] with 2 GPU(s) per engine"),
    ({"pool": (2,), "colocated": True, "rollout_pins": ()},
     "pool=[2] but co-located (its rollout runs on its training node); valid: pool=None, "
     "or colocated=false"),
    ({"options": OPTIONS}, "not poolable: options.sampling = 'batch': its stream depends on "
                           "how the prompts are split over engines"),
    ({"entry_point": "builtin:trl-grpo-tiny"}, "not poolable: the TRL job runs one engine"),
    ({"entry_point": "mypkg.jobs:make"}, "not poolable: entry 'mypkg.jobs:make' is the "
                                         "job's own code"),
    ({"launch": LaunchPlan((("train", "python t.py"), ("rollout", "python r.py")))},
     "not poolable: a cooperative [launch] job"),
])
def test_a_pool_that_cannot_be_run_is_refused_in_one_line(changes: dict[str, object],
                                                          words: str) -> None:
    fields = {"options": PER_PROMPT, "rollout_pins": (0, 1), "pool": (2, 2),
              "layout": _tp(2), **changes}
    spec = MemberSpec("p", **fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        spec.validate(rollout_nodes=2, train_nodes=1)
    assert str(err.value).startswith("member 'p': ") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_a_training_step_merges_the_slices_its_batch_was_rolled_out_as() -> None:
    """The width changed between a rollout and its training step (2 engines -> 4):
    the step merges the batch's 2 slices, the next batch's 4."""
    train = NodeRef("h800-0", Pool.TRAIN, Path("/nonexistent/t.sock"))
    m = RunningMember(MemberSpec("p"), JobRef("p", 0), train, ROLLOUT[:1])
    assert m.slices_of(0) == 1                    # nothing rolled out: as it runs now
    m.rolled_as(0, 2)
    m.engines = Gang(tuple(RankSlot(e, e, ROLLOUT[0], JobRef(f"p.e{e}", 0))
                           for e in range(4)), collective=False)
    assert m.slices_of(0) == 2 and m.slices_of(1) == 4
    m.version = 1
    m.rolled_as(1, 4)
    assert m.sliced == {1: 4}                     # the trained batch is forgotten


def test_a_width_change_is_pending_until_a_phase_boundary_and_moves_the_engines() -> None:
    """Against scripted node daemons: the same pins and pool are no change; a new pool
    on the same nodes is; a bad one is refused; at the boundary the engines follow
    (engine 1 leaves h20-1 for h20-0) and the new ones are registered where they run."""
    from tests.runtime.test_runner_fake import FakeClock, FakeNode
    from weave_slurm.node.protocol import Op
    from weave_slurm.runtime.group import GroupLayout
    from weave_slurm.runtime.port import GroupPort
    from weave_slurm.runtime.port_commands import Repin
    from weave_slurm.runtime.runner import GroupRunner

    log: list[tuple[str, Op, str]] = []
    paths = (Path("/nowhere/r0.sock"), Path("/nowhere/r1.sock"), Path("/nowhere/t.sock"))
    nodes = {p: FakeNode(log, n) for p, n in zip(paths, ("h20-0", "h20-1", "h800-0"),
                                                 strict=True)}
    rollout = tuple(NodeRef(f"h20-{i}", Pool.ROLLOUT, paths[i]) for i in range(2))
    layout = GroupLayout(rollout, (NodeRef("h800-0", Pool.TRAIN, paths[2]),))
    spec = MemberSpec("p", options=PER_PROMPT, rollout_pins=(0, 1), pool=(1, 1))
    ex = GroupRunner(layout, [spec], clock=FakeClock(), client_factory=lambda p: nodes[p])
    port, m = GroupPort(ex), ex.members["p"]
    assert m.engines is not None and [(s.job.job_id, s.node.name) for s in m.engines.slots] \
        == [("p", "h20-0"), ("p.e1", "h20-1")]
    port.apply(Repin("p", (0, 1), (1, 1)))
    assert m.repin is None                                  # nothing changes
    port.apply(Repin("p", (0, 1), (2, 0)))   # refused: its warning, it stays as it is
    assert m.repin is None and m.warning is not None
    assert re.search(r"member 'p': pool=\[2, 0\] with 1 GPU", m.warning), m.warning
    port.apply(Repin("p", (0, 1), (2, 2)))
    assert m.repin == rollout and m.repool == (2, 2)        # the same nodes, wider
    ex.tick()                                               # no phase in flight: it moves
    assert m.repin is None and m.spec.pool == (2, 2) and m.engines.size == 4
    assert [(s.job.job_id, s.node.name) for s in m.engines.slots] == [
        ("p", "h20-0"), ("p.e1", "h20-0"), ("p.e2", "h20-1"), ("p.e3", "h20-1")]
    assert ("h20-1", Op.DROP, "p.e1") in log                # engine 1 left h20-1
    assert not [j for n, op, j in log if op is Op.DROP and j in ("p", "p.e2")]
    registered = {(n, j) for n, op, j in log if op is Op.REGISTER}
    assert {("h20-0", "p.e1"), ("h20-1", "p.e2"), ("h20-1", "p.e3")} <= registered


def test_a_pool_of_several_engines_is_refused_where_a_member_is_one_process() -> None:
    """``[runtime] gangs = false`` starts one process a member: a pool it would run on one
    engine is refused in one line rather than run narrower than placed."""
    from tests.runtime.test_runner_fake import FakeClock, FakeNode
    from weave_slurm.runtime.group import GroupLayout
    from weave_slurm.runtime.member import RunnerConfig
    from weave_slurm.runtime.runner import GroupRunner

    paths = (Path("/nowhere/r0.sock"), Path("/nowhere/t.sock"))
    nodes = {p: FakeNode([], n) for p, n in zip(paths, ("h20-0", "h800-0"), strict=True)}
    layout = GroupLayout((NodeRef("h20-0", Pool.ROLLOUT, paths[0]),),
                         (NodeRef("h800-0", Pool.TRAIN, paths[1]),))
    spec = MemberSpec("p", options=PER_PROMPT, rollout_pins=(0,), pool=(2,))
    with pytest.raises(ConfigError, match=r"member 'p': pooled over 2 engines .* gangs = true"):
        GroupRunner(layout, [spec], clock=FakeClock(), client_factory=lambda p: nodes[p],
                    config=RunnerConfig(gangs=False))
