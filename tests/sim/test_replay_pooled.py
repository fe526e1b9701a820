"""Replays with pooled rollout (``weave simulate --rollout pooled``): weave's groups hold
GPUs of the rollout pool that every member's rollout spans in turn; the baselines keep
their whole nodes; weaved's own policy (``weave-live``) holds each pool as weaved does
(sim/live_pools.py), and is refused only where weaved would not run pools."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.errors import ConfigError
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.group import Member
from weave_slurm.placement.pooled import pooled_group
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.failures import pick_failure
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.policies import Accounting
from weave_slurm.sim.replay import ReplayOptions, replay_policies
from weave_slurm.sim.report import build_report

GPUS = {"rollout": 8, "train": 8}
OPTS = ReplayOptions(accounting=Accounting.CONSISTENT)


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return generate_trace(GeneratorConfig(n_jobs=30, seed=4))


def test_pooled_groups_deliver_every_jobs_work_within_its_slo(trace) -> None:  # type: ignore[no-untyped-def]
    cap = Capacity.from_site(reference_site(), 5, pooled=True)
    pols = ("weave", "weave-online", "isolated", "colocated")
    res = replay_policies(trace, cap, pols, OPTS)
    pinned = replay_policies(trace, replace(cap, rollout_pooled=False), ("isolated",), OPTS)
    rep = build_report(res, GPUS, ("weave", "weave-online"))["policies"]
    # the baselines keep their whole nodes: the same books as in a pinned run
    assert res["isolated"].cost == pytest.approx(pinned["isolated"].cost)
    assert not any(s.group.pooled for s in res["isolated"].segments)
    for name in ("weave", "weave-online"):
        r, s = res[name], rep[name]
        assert all(seg.group.pooled for seg in r.segments)
        assert s["slo_violations"] == 0 and s["life_slo_violations"] == 0
        # every job does all its work, at no less than the zero-bubble bound's cost
        for run in r.runs.values():
            assert run.done == pytest.approx(run.work, rel=1e-6), run.job.job_id
        assert s["cost_over_bound"]["total"] >= 1 - 1e-9
        for pool in ("rollout", "train"):
            assert 0 <= s["bubble"][pool] < 1
        # the schedule the replay planned is the one the runtime's ordering gives
        assert s["slo_check"]["steady"]["worst_ratio"] <= 1.0 + 1e-6
        # the books pay each pool for the share of nodes its GPUs are, all the time
        held = sum(seg.group.pool_gpus / 8 * (seg.end_s - seg.start_s) for seg in r.segments)
        assert held == pytest.approx(r.node_s["rollout"], rel=1e-9)
    assert rep["weave"]["ratios"]["vs_isolated"] > 1


def test_weaved_policy_replays_the_pools_weaved_holds() -> None:
    trace = generate_trace(GeneratorConfig(n_jobs=12, seed=4))
    cap = Capacity.from_site(reference_site(), 5, pooled=True)
    res = replay_policies(trace, cap, ("weave-live",), OPTS)["weave-live"]
    s = build_report({"weave-live": res}, GPUS, ("weave-live",))["policies"]["weave-live"]
    pooled = [seg.group for seg in res.segments if seg.group.pooled]
    assert pooled, "every job of this trace widens: weaved pools them"
    assert s["slo_violations"] == 0 and s["life_slo_violations"] == 0
    assert s["slo_check"]["steady"]["worst_ratio"] <= 1.0 + 1e-6
    for run in res.runs.values():
        assert run.done == pytest.approx(run.work, rel=1e-6), run.job.job_id
    assert s["cost_over_bound"]["total"] >= 1 - 1e-9
    # the books pay each pool for the GPUs weaved holds for it, all the time, and for
    # rows a pool replaced by a smaller one while its members move onto it (a narrower
    # pool gives back nodes of its rows instead, with no overlap: none on this trace)
    held = sum(seg.group.pool_gpus / 8 * (seg.end_s - seg.start_s) for seg in res.segments
               if seg.group.pooled)
    pinned = sum(seg.group.rollout_nodes * (seg.end_s - seg.start_s)
                 for seg in res.segments if not seg.group.pooled and not seg.group.colocated)
    assert res.held_longer_node_s >= 0
    assert held + pinned + res.held_longer_node_s == pytest.approx(res.node_s["rollout"],
                                                                   rel=1e-9)
    # no job taken as width-free: none pooled, the pinned replay's books
    none = replay_policies(trace, cap, ("weave-live",), replace(OPTS, width_free=False))
    as_pinned = replay_policies(trace, replace(cap, rollout_pooled=False), ("weave-live",),
                                OPTS)
    assert not any(seg.group.pooled for seg in none["weave-live"].segments)
    assert none["weave-live"].cost == pytest.approx(as_pinned["weave-live"].cost)


def test_weaved_policy_is_refused_pools_where_weaved_runs_none(trace) -> None:  # type: ignore[no-untyped-def]
    cap = Capacity.from_site(reference_site(), 5, pooled=True)
    with pytest.raises(ConfigError, match=r"--rollout pooled with --policy weave-live: "
                       r"weaved runs pooled groups only where the site sets \[runtime\] "
                       r"gangs = true .*valid: --rollout pinned"):
        replay_policies(trace, cap, ("weave-live",), replace(OPTS, gang_gpus=None))


def test_simulate_takes_rollout_pooled(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "t.toml"
    assert run_app(app, "weave", ["trace", "generate", str(src), "--jobs", "12"]) == 0
    out = tmp_path / "r.json"
    assert run_app(app, "weave", ["simulate", str(src), "--rollout", "pooled", "--policy",
                                  "weave-online,isolated", "--accounting", "consistent",
                                  "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["site"]["rollout"] == {"weave-online": "pooled", "isolated": "pinned"}
    assert doc["policies"]["weave-online"]["slo_violations"] == 0
    # unset: weave pools, weave-live as the site (the reference's: gangs on, so
    # pooled), others pinned
    assert run_app(app, "weave", ["simulate", str(src), "--policy", "weave,weave-live,"
                                  "weave-online,isolated", "--no-verify", "--json",
                                  str(out)]) == 0
    assert json.loads(out.read_text())["site"]["rollout"] == {
        "weave": "pooled", "weave-live": "pooled", "weave-online": "pinned",
        "isolated": "pinned"}
    capsys.readouterr()
    assert run_app(app, "weave", ["simulate", str(src), "--rollout", "bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--rollout 'bogus'" in err and "pinned, pooled" in err
    site = Path(__file__).parents[2] / "configs" / "reference-colocation.toml"   # gangs off
    assert run_app(app, "weave", ["simulate", str(src), "--rollout", "pooled", "--site",
                                  str(site), "--policy", "weave-live"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--policy weave-live" in err and "gangs" in err


def test_a_failed_node_of_a_pool_hits_every_member() -> None:
    jobs = [simple_profile(j, 100.0, 80.0, 2.0) for j in ("a", "b")]
    g = pooled_group(1, tuple(Member(j, (0,)) for j in jobs), 12, 8)   # 1.5 nodes
    rng = random.Random(3)
    hits = [pick_failure((g,), rng) for _ in range(400)]
    rollout = [h for h in hits if h is not None and h.pool == "rollout"]
    assert rollout and all(h.jobs == ("a", "b") for h in rollout)
    # 1.5 rollout nodes' worth against 1 training node
    assert 0.5 < len(rollout) / len(hits) < 0.7
