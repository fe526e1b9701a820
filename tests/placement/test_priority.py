"""The fair-share priority (placement/priority.py): Slurm's classic factor per level,
the age factor, decay of usage, shares and default shares."""

from __future__ import annotations

import pytest

from weave_slurm.config.fairshare import FairShareConfig
from weave_slurm.placement.priority import Claimant, FairShare, Usage

H = 3600.0
NOW = 1000 * H
CFG = FairShareConfig(enabled=True, half_life_h=10.0, max_age_h=2.0, weight_fairshare=1000.0,
                      weight_age=100.0)


def test_nobody_used_anything_everyone_has_factor_one() -> None:
    share = FairShare(CFG, [], [Claimant("a", "x", NOW), Claimant("b", "x", NOW)], NOW)
    assert share.factor("a", "x") == share.factor("b", "x") == 1.0
    assert share.priority(Claimant("a", "x", NOW)) == 1000


def test_usage_against_shares_as_slurms_classic_factor() -> None:
    """Two users of one account, equal shares: the one who used it all has 2^-(1/0.5);
    the account, alone, used all of its whole share: 2^-(1/1) for both."""
    usage = [Usage("a", "x", 100 * H, NOW)]
    share = FairShare(CFG, usage, [Claimant("b", "x", NOW)], NOW)
    assert share.factor("a", "x") == pytest.approx(0.5 * 0.25)  # U=1, S=1/2
    assert share.factor("b", "x") == pytest.approx(0.5 * 1.0)   # U=0
    # two accounts: x used it all with half the shares
    two = FairShare(CFG, usage, [Claimant("b", "y", NOW)], NOW)
    assert two.factor("a", "x") == pytest.approx(0.25 * 0.25)   # account x used it all
    assert two.factor("b", "y") == pytest.approx(1.0)


def test_shares_and_the_default_share() -> None:
    """alice holds 3 shares, bob the default 1: at equal usage alice ranks higher."""
    cfg = FairShareConfig(enabled=True, users={"alice": 3.0}, weight_age=0.0)
    usage = [Usage("alice", "x", 50 * H, NOW), Usage("bob", "x", 50 * H, NOW)]
    share = FairShare(cfg, usage, [], NOW)
    assert share.factor("alice", "x") == pytest.approx(2 ** (-0.5 / 0.75) * 0.5)
    assert share.factor("bob", "x") == pytest.approx(2 ** (-0.5 / 0.25) * 0.5)


def test_usage_decays_by_half_every_half_life() -> None:
    old = [Usage("a", "x", 100 * H, NOW - 10 * H), Usage("b", "x", 50 * H, NOW)]
    share = FairShare(CFG, old, [], NOW)
    assert share.factor("a", "x") == pytest.approx(share.factor("b", "x"))   # 50 == 50


def test_age_adds_up_to_its_weight_at_max_age() -> None:
    share = FairShare(CFG, [], [], NOW)
    assert share.priority(Claimant("a", "x", NOW - 1 * H)) == 1050
    assert share.priority(Claimant("a", "x", NOW - 5 * H)) == 1100     # capped
