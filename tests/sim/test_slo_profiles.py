"""SLO distribution specs and profile tables."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.sim.profiles import JobKind, SyntheticProfileDistribution, load_profile_table
from weave_slurm.sim.slo import SloDistribution


def test_slo_specs() -> None:
    uniform = SloDistribution.parse("uniform:1.1,2")
    assert (uniform.low, uniform.high) == (1.1, 2.0) and str(uniform) == "uniform:1.1,2"
    assert SloDistribution.parse("fixed:1.5").draw(random.Random(0)) == 1.5
    rng = random.Random(1)
    assert all(1.1 <= uniform.draw(rng) <= 2.0 for _ in range(100))
    for bad, pattern in [("normal:1,2", "unknown SLO distribution"), ("uniform", "lacks"),
                         ("uniform:1", "needs 2"), ("uniform:2,1", "1 <= LOW <= HIGH"),
                         ("fixed:0.5", "1 <= LOW"), ("fixed:x", "non-numeric"),
                         ("uniform:1,inf", "finite")]:
        with pytest.raises(ConfigError, match=pattern):
            SloDistribution.parse(bad)


def test_profile_table_and_kinds(tmp_path: Path) -> None:
    table = load_profile_table()
    assert len(table.kinds) == 16 and table.kinds[0] == "3B_4k" and table.kinds[-1] == "32B_8k"
    assert table.lookup("8B_32k", "colo") is not None
    kind = JobKind.parse("32B_8k")
    assert kind.model_params_b == 32 and kind.max_response_tokens == 8192 and kind.needs_two_nodes
    with pytest.raises(ConfigError, match="14B"):
        JobKind.parse("fourteen")
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"disagg": {"7B_8k": {"generate": -1, "train": 2}}, "colo": {}}))
    with pytest.raises(ConfigError, match=r"disagg.7B_8k.generate: -1"):
        load_profile_table(bad)
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profile_table(bad)


def test_synthetic_profiles_cover_all_classes() -> None:
    rng = random.Random(0)
    draws = [SyntheticProfileDistribution().draw(rng) for _ in range(2000)]
    assert min(d.rollout_s for d in draws) >= 25 and max(d.rollout_s for d in draws) <= 600
    assert sum(d.rollout_s > 2 * d.train_s for d in draws) > 300  # rollout-heavy classes
    assert sum(d.train_s > 2 * d.rollout_s for d in draws) > 300  # train-heavy classes
