"""What weave status / show print from the runtime's live fields, and the spec keys
the runtime reads (iterations, seed, [options])."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.specs import typed
from weave_slurm.cli.status import _runtime_lines, format_rows
from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.driver import IdleDriver
from weave_slurm.daemon.group_runtime import GroupRuntime
from weave_slurm.daemon.member_specs import member_spec
from weave_slurm.daemon.records import GroupPlan, GroupRow, MemberPlan
from weave_slurm.daemon.states import GroupState
from weave_slurm.errors import ConfigError

ROW = {"job": 7, "user": "u", "uid": 0, "name": "a", "group": 1, "state": "RUNNING",
       "phase": "rollout", "iter": "12/30", "slowdown": 1.8, "slo_ok": False, "slo": 1.5,
       "time_s": 3.0, "nodes": ["h20-0"], "reason": ""}


def test_status_shows_phase_iter_and_violated_slo() -> None:
    head, line = format_rows([ROW], "default")
    assert head.split()[4:7] == ["PHASE", "ITER", "SLOWDOWN/SLO"]
    assert line.split()[4:7] == ["rollout", "12/30", "1.80/1.50!"]
    ok = format_rows([{**ROW, "slo_ok": True, "slowdown": 1.2}], "default")[1]
    assert "1.20/1.50" in ok.split() and "!" not in ok


def test_show_prints_the_four_quantities_and_drift() -> None:
    rt = {"member_state": "train", "version": 3, "iterations": 5, "node": "h800-0",
          "recoveries": 0, "error": None, "drift": ["rollout 2.0x declared"],
          "measured": {"rollout_s": [0.2, 0.3, 0.25], "train_s": [0.5], "sync_s": [0.01],
                       "rollout_state_bytes": 100, "train_state_bytes": 400,
                       "sync_bytes": {"weights": 300, "trajectories": 50},
                       "slowdown": 1.3, "slo": 1.5, "slo_ok": True}}
    text = "\n".join(_runtime_lines(rt))
    assert "version=3/5" in text
    assert "measured.rollout_time=n=3 median=0.250s max=0.300s" in text
    assert "measured.state_bytes=rollout:100 train:400" in text
    assert "trajectories:50,weights:300" in text
    assert "drift=rollout 2.0x declared" in text
    assert _runtime_lines(None) == []


def test_spec_iterations_seed_options() -> None:
    job = parse_job(job_spec_toml("x", iterations=3, seed=4, options={"task": "copy"}))
    assert (job.iterations, job.seed, job.options) == (3, 4, (("task", "copy"),))
    default = parse_job(job_spec_toml("x"))
    assert (default.iterations, default.seed, default.options) == (10, 0, ())
    with pytest.raises(ConfigError, match="iterations"):
        parse_job(job_spec_toml("x", iterations=0))
    with pytest.raises(ConfigError, match="options"):
        parse_job(job_spec_toml("x") + "[options]\nbad = [[1, 2]]\n")


def test_member_spec_from_a_stored_job() -> None:
    from weave_slurm.daemon.records import JobRow
    from weave_slurm.daemon.states import JobState
    from weave_slurm.model.profile import simple_profile

    prof = simple_profile("9", 4.0, 6.0, 2.0)
    text = job_spec_toml("x", iterations=3, seed=4, options={"task": "copy"})
    job = JobRow(9, 0, "u", "x", *typed(text),
                 "x.toml", prof, JobState.RUNNING, "", 1, 0.0, 0.0, None)
    group = GroupRow(1, "1", GroupState.ACTIVE, GroupPlan(2, 1, (MemberPlan(9, (1,)),)),
                     0.0, "")
    spec = member_spec(job, group)
    assert (spec.job_id, spec.steps, spec.seed, spec.rollout_pins) == ("9", 3, 4, (1,))
    assert dict(spec.options) == {"task": "copy"} and spec.declared.slo == 2.0
    rt = GroupRuntime(lambda a, n: n)  # type: ignore[arg-type,return-value]
    assert rt.job_steps(job, group, []) == [] and rt.live(9) is None
    assert IdleDriver().live(9) is None


def test_a_group_waiting_for_its_node_daemons_says_why_in_status() -> None:
    """Before a group's runtime starts, status shows why it waits (and does not break)."""
    from weave_slurm.daemon.records import GroupPlan, GroupRow, MemberPlan
    from weave_slurm.daemon.states import GroupState
    from weave_slurm.daemon.waits import WaitCause

    rt = GroupRuntime(lambda a, n, p: n)  # type: ignore[arg-type,return-value]
    group = GroupRow(1, "x.1", GroupState.ACTIVE, GroupPlan(1, 1, (MemberPlan(9, (0,)),)),
                     0.0, "")
    rt.waits.wait(group, WaitCause.NODE_SILENT,
                  "the node daemon on h20-0 does not answer yet: refused", 0.0)
    assert rt.live(9) is None          # nothing ran: no runtime row (as before the wait)
    assert rt.waiting(9) == ("the node daemon on h20-0 does not answer yet: refused "
                             "(node_start_wait_s: 300 s left)")
    assert rt.waiting(8) is None


def test_a_group_waiting_for_weaveds_own_node_daemons_gives_advice_that_applies(
        tmp_path: Path) -> None:
    """weaved starts its node daemons itself (its node-daemon steps): while one does not
    answer yet, the wait says so with that step's log, not 'weave node serve' (the
    advice for a daemon you start, which a plain client still gets)."""
    from weave_slurm.config.site import default_site
    from weave_slurm.daemon.node_daemons import NodeDaemons, NodeDaemonSettings
    from weave_slurm.daemon.records import AllocRow
    from weave_slurm.daemon.states import AllocState
    from weave_slurm.errors import NodeGone
    from weave_slurm.node.node_client import NodeClient

    nodes = NodeDaemons(NodeDaemonSettings(tmp_path), default_site(),
                        None)  # type: ignore[arg-type]   # ref() asks no local backend
    allocs = [AllocRow(1, 1, "rollout", "h20-0", "h20", 1, 8, None, 2, AllocState.HELD,
                       "7", ("n1",), ""),
              AllocRow(2, 1, "train", "h800-0", "h800", 1, 8, None, 2, AllocState.HELD,
                       "8", ("n2",), "")]
    group = GroupRow(1, "x.1", GroupState.ACTIVE, GroupPlan(1, 1, (MemberPlan(9, (0,)),)),
                     0.0, "")
    rt = GroupRuntime(nodes.ref)
    rt._build(group, allocs, 0.0)               # no daemon listens at n1's socket yet
    why = rt.waiting(9)
    assert why is not None and why.startswith("the node daemon on n1 does not answer "), why
    assert "weave node serve" not in why, why
    assert f"weaved starts it (its node-daemon step); waiting for that step, see its log " \
           f"{nodes.log_path(allocs[0])}" in why, why
    with pytest.raises(NodeGone, match="start it with 'weave node serve'"):
        NodeClient(tmp_path / "nobody.sock")    # a daemon weaved does not start
