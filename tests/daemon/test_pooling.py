"""weaved's pools (daemon/pooling.py): placement's widths as GPU shares of nodes, who
is pooled, and a stored pooled plan read back as placement's pool."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.harness.specs import stored
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import default_site
from weave_slurm.daemon import allocplan, membership, pooling
from weave_slurm.daemon.api import Api
from weave_slurm.daemon.records import AllocRow, GroupPlan, MemberPlan
from weave_slurm.daemon.states import AllocState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError
from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Capacity, Member
from weave_slurm.placement.pooled import RowShrink, pool_rows, pooled_group, shares, stripe_nodes

CAP = replace(Capacity(4, 8, 1000.0, 1000.0, 16, 16, CostRates(1.0, 2.85)),
              rollout_pooled=True, rollout_gpus_per_node=8)


@pytest.mark.parametrize(("width", "step", "want"), [
    (4, 1, (1, 4)), (8, 1, (1, 8)), (12, 1, (2, 6)), (11, 1, (2, 6)), (9, 1, (2, 5)),
    (12, 4, (2, 8)), (6, 2, (1, 6)), (17, 1, (3, 6)), (24, 8, (3, 8))])
def test_a_width_is_held_on_the_fewest_nodes_with_equal_shares(
        width: int, step: int, want: tuple[int, int]) -> None:
    n, g = shares(width, 8, step)
    assert (n, g) == want
    assert n * g >= width and g % step == 0 and g <= 8
    assert n == -(-width // 8)   # never more nodes than the width needs


def test_a_step_that_splits_an_engine_over_nodes_is_refused() -> None:
    with pytest.raises(ConfigError, match="divides 8"):
        shares(6, 8, 3)


def _rows(tmp_path: Path, *texts: str) -> tuple[Store, list[int]]:
    store = Store(tmp_path / "w.db")
    ids = [store.add_job(uid=1000, user="alice", name=f"j{i}", **stored(f"j{i}", t),
                         source=f"j{i}.toml", profile=simple_profile(f"j{i}", 100, 40, 1.5),
                         now=1.0) for i, t in enumerate(texts)]
    return store, ids


PER_PROMPT = job_spec_toml("a", options={"sampling": "per_prompt"})
BATCH = job_spec_toml("b", options={"sampling": "batch"})


def test_only_a_job_whose_batch_is_width_free_may_be_pooled(tmp_path: Path) -> None:
    store, (a, b) = _rows(tmp_path, PER_PROMPT, BATCH)
    ja, jb = store.job(a), store.job(b)
    assert ja is not None and jb is not None
    assert pooling.why_not(ja) is None
    assert "options.sampling = 'batch'" in str(pooling.why_not(jb))
    assert pooling.planned(ja.profile, ja, True) == ja.profile
    pinned = pooling.planned(jb.profile, jb, True)
    assert pinned.rollout_floor_fraction == 1.0   # no width speeds it up: never pooled
    assert pooling.planned(jb.profile, jb, False) == jb.profile   # pools off: as it is


def test_a_pooled_plan_pins_every_member_to_every_share_and_reads_back(
        tmp_path: Path) -> None:
    store, ids = _rows(tmp_path, PER_PROMPT, PER_PROMPT, PER_PROMPT)
    jobs = [store.job(i) for i in ids]
    members = tuple(Member(j.profile.with_id(str(j.job_id)), (0,)) for j in jobs if j)
    group = pooled_group(1, members, 12, 8)
    plan = membership.plan_of(group)
    assert plan == GroupPlan(2, 1, tuple(MemberPlan(i, (0, 1)) for i in ids), rollout_gpus=6)
    assert GroupPlan.from_json(plan.to_json()) == plan
    store.commit_placement([(1, "1", plan, True)], [(i, 1, "joined") for i in ids], 2.0)
    state = membership.cluster_state(CAP, store.groups(), store.jobs(), 2)
    (rebuilt,) = state.groups
    assert rebuilt.pooled and rebuilt.pool_gpus == 12
    assert rebuilt.job_ids == group.job_ids
    assert rebuilt.schedule.period_s == pytest.approx(group.schedule.period_s)
    # what a replacement's new row may count on: the rollout pool's GPUs less the pool's
    assert membership.free_rollout_gpus(CAP, store.groups(), store.jobs(), 2, {}) == 16 * 8 - 12


def _row(key: int, nodes: int, gpus: int, state: AllocState = AllocState.HELD) -> AllocRow:
    names = tuple(f"h20-{i}" for i in range(nodes))
    return AllocRow(key, 1, "rollout", f"h20-{key}", "h20", nodes, gpus, "h20", 1, state,
                    str(100 + key), names, "")


def test_a_wider_pool_keeps_its_shares_and_asks_only_what_it_lacks() -> None:
    """Slurm grows no allocation: a wider pool keeps the shares it holds (its members'
    warm state is there) and asks one new row for the GPUs it lacks, which may land on
    the same hosts; a narrower one returns whole rows, newest first."""
    before = GroupPlan(2, 1, (MemberPlan(1, (0, 1)), MemberPlan(2, (0, 1))), rollout_gpus=4)
    allocs = [_row(1, 2, 4)]
    assert pooling.width(before, allocs) == 8
    wider = pooling.pooled_plan([(1, 1), (2, 1)], 1, 12, 8, 1, before, allocs)
    # 12 GPUs: the 4 + 4 it holds, and 4 more, spread as it is: 2 of each of two nodes
    pins = (0, 1, 2, 3)
    assert wider == GroupPlan(4, 1, (MemberPlan(1, pins), MemberPlan(2, pins)),
                              rollout_gpus=2)
    assert pooling.width(wider, allocs) == 12
    assert pooling.member_pool(wider, 1, allocs) == (4, 4, 2, 2)
    much = pooling.pooled_plan([(1, 1)], 1, 20, 8, 1, before, allocs)
    assert much.members[0].rollout_pins == pins and much.rollout_gpus == 6
    assert pooling.slot_gpus(much, allocs) == {0: 4, 1: 4, 2: 6, 3: 6}
    held = [_row(1, 2, 4), _row(2, 2, 6)]   # once the new row is held: a narrower pool
    narrow = pooling.pooled_plan([(1, 1)], 1, 8, 8, 1, much, held)
    assert narrow == GroupPlan(2, 1, (MemberPlan(1, (0, 1)),), rollout_gpus=4)
    keep = pooling.pooled_plan([(1, 1)], 1, 6, 8, 1, before, allocs)
    assert keep == before.without({2})   # one row: held whole, though wider than needed
    # a lost share's slots are never kept: what it held is asked again
    one = GroupPlan(1, 1, (MemberPlan(1, (0,)),), rollout_gpus=4)
    lost = pooling.pooled_plan([(1, 1)], 1, 4, 8, 1, one, [_row(1, 1, 4, AllocState.LOST)])
    assert lost == GroupPlan(1, 1, (MemberPlan(1, (1,)),), rollout_gpus=4)
    # a newcomer with 8-GPU engines cannot use 4-GPU shares: its pool is new rows
    big = pooling.pooled_plan([(1, 1), (3, 1)], 1, 8, 8, 8, before, allocs)
    assert big == GroupPlan(1, 1, (MemberPlan(1, (2,)), MemberPlan(3, (2,))), rollout_gpus=8)


def test_status_shows_a_pool_as_placement_sees_it_on_the_shares_it_holds(
        tmp_path: Path) -> None:
    """A pool of a 6 + 6 row and a 2 + 2 row beside it (a widened pool): ``weave
    status``'s group is the one placement decides over (16 GPUs, its period), not one
    priced on the plan's newest share alone."""
    store, ids = _rows(tmp_path, PER_PROMPT, PER_PROMPT)
    pins = (0, 1, 2, 3)
    plan = GroupPlan(4, 1, tuple(MemberPlan(i, pins) for i in ids), rollout_gpus=2)
    store.commit_placement([(1, "1", plan, True)], [(i, 1, "joined") for i in ids], 2.0)
    for n, (gpus, job) in enumerate([(6, "101"), (2, "102")]):
        key = store.add_alloc(group_id=1, role="rollout", pool=f"h20-{n}", partition="h20",
                              node_count=2, gpus_per_node=gpus, gpu_type="h20",
                              cpus_per_node=1, now=2.0, reason="test")
        store.transition("alloc", key, AllocState.ALLOCATING, "asked", 2.0)
        store.transition("alloc", key, AllocState.HELD, "granted", 2.0, alloc_id=job,
                         nodes='["h20-0", "h20-1"]')
    (placed,) = membership.cluster_state(CAP, store.groups(), store.jobs(), 2,
                                         {1: store.allocs(1)}).groups
    assert placed.pool_gpus == 16
    (view,) = Api(store, default_site(), CAP, lambda: 3.0).groups()["groups"]
    assert view["pool_gpus"] == 16
    assert view["period_s"] == pytest.approx(placed.schedule.period_s)


def test_a_narrower_pool_gives_back_its_spare_nodes_and_replaces_no_row() -> None:
    """A narrower pool keeps the rows it needs and gives back the nodes of them it can
    spare, newest rows first, each row keeping its first node (Slurm's batch host):
    its members are pinned to the nodes it keeps, and the others are what weaved gives
    back to Slurm (allocplan's "Spare nodes"). It is offered no replacement of rows,
    whatever pays (docs/simulator.md: with the shrink a replacement costs more)."""
    def always(s: RowShrink) -> bool:
        return True

    pins = (0, 1, 2, 3)
    before = GroupPlan(4, 1, (MemberPlan(1, pins), MemberPlan(2, pins)), rollout_gpus=2)
    held = [_row(1, 2, 5), _row(2, 2, 2)]
    assert pooling.width(before, held) == 14
    for pays in (None, always):
        shrunk = pooling.pooled_plan([(1, 1), (2, 1)], 1, 11, 8, 1, before, held, pays, 64)
        assert shrunk == GroupPlan(3, 1, (MemberPlan(1, (0, 1, 2)), MemberPlan(2, (0, 1, 2))),
                                   rollout_gpus=2)
    assert pooling.width(shrunk, held) == 12
    assert allocplan.spare_nodes(shrunk, held) == [(held[1], ("h20-1",))]
    assert [(a.key, n) for a, n in allocplan.kept_nodes(shrunk, held)] == [
        (1, "h20-0"), (1, "h20-1"), (2, "h20-0")]
    # once given back, its slot is retired: the plan reads back the same, nothing spare
    gone = [held[0], replace(held[1], gone=("h20-1",))]
    assert allocplan.spare_nodes(shrunk, gone) == []
    assert pooling.pooled_plan([(1, 1), (2, 1)], 1, 11, 8, 1, shrunk, gone) == shrunk
    assert [w for w in allocplan.needs(shrunk, gone).wants if w.role == "rollout"] == []
    # a pool of one node keeps it whole, whatever pays: there is nothing to give back
    one = GroupPlan(1, 1, (MemberPlan(1, (0,)),), rollout_gpus=8)
    assert pooling.pooled_plan([(1, 1)], 1, 4, 8, 1, one, [_row(1, 1, 8)], always, 64) == one
    # a pinned group keeps an unpinned node of a row it holds, as before
    pinned = GroupPlan(2, 1, (MemberPlan(1, (0,)),))
    assert allocplan.spare_nodes(pinned, [_row(1, 2, 8)]) == []


def test_a_wider_pool_may_replace_rows_only_where_the_model_says_it_pays() -> None:
    """A wider pool's new row is judged by ``placement.pool_shrink`` (the model's
    books), as before; without a capacity it never replaces."""
    jobs = [simple_profile(n, 100.0, 600.0, 3.0) for n in ("1", "2")]
    group = pooled_group(1, tuple(Member(j, (0,)) for j in jobs), 6, 8)
    before = GroupPlan(1, 1, (MemberPlan(1, (0,)), MemberPlan(2, (0,))), rollout_gpus=4)
    held = [_row(1, 1, 4)]
    plain = membership.plan_of(group, before, held)
    assert plain == GroupPlan(2, 1, (MemberPlan(1, (0, 1)), MemberPlan(2, (0, 1))),
                              rollout_gpus=2)
    assert pooling.width(plain, held) == 6


@pytest.mark.parametrize(("width", "stripe", "want"), [
    (6, 2, (2, 3)), (6, 1, (1, 6)), (12, 2, (2, 6)), (3, 8, (3, 1)), (6, 8, (6, 1)),
    (4, 2, (2, 2)), (7, 2, (2, 4)), (9, 8, (5, 2)), (10, 8, (5, 2))])
def test_a_new_pool_is_striped_over_the_nodes_a_group_may_span(
        width: int, stripe: int, want: tuple[int, int]) -> None:
    """A new pool's first row spreads over up to ``stripe`` nodes where its width allows
    an engine (here 1 GPU) on each, as long as it holds at most one engine more than on
    its fewest GPUs (7 on two nodes: 4 + 4; 9 on up to eight: 5 x 2, not 8 x 2)."""
    keep, new = pool_rows((), width, 8, 1, stripe=stripe)
    assert keep == () and new == want


def test_a_striped_pool_widens_on_a_row_that_fits_beside_it() -> None:
    """The defect the stripe mends (issue 34): a 6-GPU pool on two 8-GPU nodes, widened
    to 16. On one node (6) the row for the other 10 is 5 + 5, which fits nowhere beside
    it (2 GPUs free on one node); striped (3 + 3), the row is 5 + 5 again, and each node
    holds 3 + 5 of its 8."""
    cap = replace(CAP, max_rollout_nodes_per_group=8, rollout_pool_nodes=2)
    stripe = stripe_nodes(cap)
    assert stripe == 2
    first = pooling.pooled_plan([(1, 1)], 1, 6, 8, 1, None, [], stripe=stripe)
    assert first == GroupPlan(2, 1, (MemberPlan(1, (0, 1)),), rollout_gpus=3)
    allocs = [_row(1, 2, 3)]
    wider = pooling.pooled_plan([(1, 1), (2, 1)], 1, 16, 8, 1, first, allocs, stripe=stripe)
    gpus = pooling.slot_gpus(wider, allocs)
    assert gpus == {0: 3, 1: 3, 2: 5, 3: 5}
    # the new row's two nodes are the pool's two hosts: each holds both shares
    assert gpus[0] + gpus[2] <= 8 and gpus[1] + gpus[3] <= 8
    packed = pooling.pooled_plan([(1, 1)], 1, 6, 8, 1, None, [], stripe=1)   # one node: 6
    lacks = pooling.pooled_plan([(1, 1), (2, 1)], 1, 16, 8, 1, packed, [_row(1, 1, 6)])
    packed_gpus = pooling.slot_gpus(lacks, [_row(1, 1, 6)])
    assert packed_gpus == {0: 6, 1: 5, 2: 5}
    assert packed_gpus[0] + packed_gpus[1] > 8   # 2 GPUs free beside it: never fits
    assert stripe_nodes(replace(CAP, max_rollout_nodes_per_group=1)) == 1
