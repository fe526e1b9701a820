"""bench/decision_quality.py on tiny traces: the JSON's shape, positive costs, ratios that
agree with the costs, and its usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "decision_quality.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def _cases(tmp_path: Path, rollout: str, mixes: tuple[str, ...]) -> dict[str, Any]:
    out = tmp_path / f"dq-{rollout}.json"
    proc = _run("--jobs", "10", "--days", "1", "--seeds", "1", "--rollout", rollout,
                "--mixes", ",".join(mixes), "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vs co-located" in proc.stdout and f"of {4 * len(mixes)}" in proc.stdout
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["jobs"] == 10 and doc["seeds"] == [1] and doc["rollout"] == rollout
    assert doc["slos"] == {"tight": "uniform:1.0,1.2", "loose": "uniform:1.5,2"}
    cases: dict[str, Any] = doc["cases"]
    assert set(cases) == {f"{mix}/{slo}/1/{acc}" for mix in mixes
                          for slo in ("tight", "loose") for acc in ("reference", "consistent")}
    assert doc["losses"] == [n for n, c in cases.items() if c["loses"]]
    return cases


@pytest.mark.parametrize(("rollout", "mixes"), [
    ("pooled", ("rollout-heavy", "train-heavy", "mixed", "synthetic-train-heavy")),
    ("pinned", ("rollout-heavy", "train-heavy")),
])
def test_tiny_table_shape_and_consistent_ratios(tmp_path: Path, rollout: str,
                                                mixes: tuple[str, ...]) -> None:
    for name, c in _cases(tmp_path, rollout, mixes).items():
        mix, slo, seed, acc = name.split("/")
        assert (c["mix"], c["slo"], str(c["seed"]), c["accounting"]) == (mix, slo, seed, acc)
        assert c["jobs"] == 10
        cost = c["cost"]
        assert set(cost) == {"weave", "isolated", "colocated"}
        assert all(v > 0 for v in cost.values()) and c["bound"] > 0
        assert all(v > 0 for v in c["reference_units"].values())
        assert c["vs_isolated"] == pytest.approx(cost["isolated"] / cost["weave"], abs=1e-3)
        assert c["vs_colocated"] == pytest.approx(cost["colocated"] / cost["weave"], abs=1e-3)
        assert c["cost_over_bound"]["total"] == pytest.approx(cost["weave"] / c["bound"],
                                                              rel=1e-3)
        best = min(cost["isolated"], cost["colocated"])
        assert c["over_best_baseline"] == pytest.approx(cost["weave"] / best, abs=1e-3)
        assert c["loses"] is (cost["weave"] > best)
        assert 0.0 <= c["slo_attainment"] <= 1.0
        assert set(c["bubble"]) == {"rollout", "train"}
        # None: weave held none of that pool (every job co-located)
        assert all(b is None or 0.0 <= b < 1.0 for b in c["bubble"].values())
        if acc == "consistent":   # no policy can go below the bound there
            assert c["cost_over_bound"]["total"] >= 1.0 - 1e-9
            # a pinned pool's cost over its part of the bound is its held time over its
            # busy time, 1 / (1 - bubble), where all its work ran in it; a co-located
            # job's rollout runs on training nodes (in the rollout bound, not in the
            # rollout pool's busy time), so it is at most that (a pooled rollout wider
            # than its weights-bound floor may exceed it: docs/simulator.md "The
            # zero-bubble lower bound")
            if c["bubble"]["rollout"] is not None and rollout == "pinned":
                assert c["cost_over_bound"]["rollout"] <= \
                    1 / (1 - c["bubble"]["rollout"]) * (1 + 1e-3)


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--mixes", "train-heavy,bogus", ("--mixes", "rollout-heavy", "train-heavy", "mixed")),
    ("--slos", "strict", ("--slos", "tight", "loose")),
    ("--seeds", "1,x", ("--seeds", "integers")),
])
def test_a_bad_choice_is_one_line_and_exit_2(flag: str, value: str,
                                             words: tuple[str, ...]) -> None:
    proc = _run(flag, value)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
