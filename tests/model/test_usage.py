"""A member's share of its group's allocations: equal split among the members present."""

from __future__ import annotations

import itertools

import pytest

from weave_slurm.model.cost import CostRates
from weave_slurm.model.usage import Held, Membership, split_usage
from weave_slurm.vocab import Pool

RATES = CostRates(rollout_node_hour=8.0, train_node_hour=24.0)
H = 3600.0


def test_two_members_split_both_pools_equally() -> None:
    held = [Held("11", Pool.ROLLOUT, 1, 8, 0.0, 2 * H), Held("12", Pool.TRAIN, 2, 8, 0.0, 2 * H)]
    members = [Membership(1, 0.0, 2 * H), Membership(2, 0.0, 2 * H)]
    split = split_usage(held, members, 0.0, 2 * H, RATES)
    for job in (1, 2):
        share = split.members[job]
        assert share.gpu_s[Pool.ROLLOUT] == pytest.approx(8 * H)     # 8 GPUs x 2 h / 2
        assert share.gpu_s[Pool.TRAIN] == pytest.approx(16 * H)      # 16 GPUs x 2 h / 2
        assert share.node_s[Pool.TRAIN] == pytest.approx(2 * H)
        assert share.cost == pytest.approx(1 * 8.0 + 2 * 24.0)        # half of 2 h of each
        assert share.alloc_ids == {"11", "12"}
    assert split.unattributed.empty


def test_a_member_joining_later_pays_only_from_then() -> None:
    held = [Held("7", Pool.TRAIN, 1, 8, 0.0, 3 * H)]
    members = [Membership(1, 0.0, 3 * H), Membership(2, 1 * H, 3 * H)]
    split = split_usage(held, members, 0.0, 3 * H, RATES)
    # first hour job 1 alone (8 GPU-h), then two hours halved (8 GPU-h each)
    assert split.members[1].gpu_s[Pool.TRAIN] == pytest.approx(16 * H)
    assert split.members[2].gpu_s[Pool.TRAIN] == pytest.approx(8 * H)
    total = sum(s.cost for s in split.members.values())
    assert total == pytest.approx(3 * 24.0)   # the members pay the whole allocation


def test_time_with_no_member_is_unattributed() -> None:
    held = [Held("7", Pool.ROLLOUT, 2, 4, 0.0, 2 * H)]
    split = split_usage(held, [Membership(5, 0.0, 0.5 * H)], 0.0, 2 * H, RATES)
    assert split.members[5].gpu_s[Pool.ROLLOUT] == pytest.approx(8 * 0.5 * H)
    assert split.unattributed.gpu_s[Pool.ROLLOUT] == pytest.approx(8 * 1.5 * H)
    assert split.unattributed.cost == pytest.approx(2 * 1.5 * 8.0)


def test_consecutive_windows_add_up_to_the_whole() -> None:
    held = [Held("1", Pool.ROLLOUT, 1, 8, 100.0, 5000.0),
            Held("2", Pool.TRAIN, 1, 8, 150.0, 9000.0),
            Held("3", Pool.ROLLOUT, 1, 8, 2000.0, 4000.0)]
    members = [Membership(1, 90.0, 7000.0), Membership(2, 1234.5, 9500.0)]
    whole = split_usage(held, members, 0.0, 10_000.0, RATES)
    cuts = [0.0, 77.0, 1000.0, 1234.5, 3999.0, 8000.0, 10_000.0]
    parts = [split_usage(held, members, a, b, RATES) for a, b in itertools.pairwise(cuts)]
    for job in (1, 2):
        for pool in Pool:
            got = sum(p.members[job].gpu_s[pool] for p in parts if job in p.members)
            assert got == pytest.approx(whole.members[job].gpu_s[pool])
        assert sum(p.members[job].cost for p in parts if job in p.members) == \
            pytest.approx(whole.members[job].cost)
    paid = sum(h.node_count * (h.end_s - h.start_s) / H * RATES.price(h.pool) for h in held)
    assert sum(s.cost for s in whole.members.values()) + whole.unattributed.cost == \
        pytest.approx(paid)


def test_outside_the_window_and_empty_window_book_nothing() -> None:
    held = [Held("1", Pool.TRAIN, 1, 8, 0.0, 10.0)]
    assert split_usage(held, [Membership(1, 0.0, 10.0)], 10.0, 20.0, RATES).members == {}
    assert split_usage(held, [Membership(1, 0.0, 10.0)], 5.0, 5.0, RATES).members == {}
