"""daemon/job_terms.py through the reconcile loop (fake Slurm, virtual clock): a group's
allocations are asked with its members' account, QOS and time limit (the site's when
they name none), and a job that has run its --time is ended as Slurm's TIMEOUT."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.daemon.test_reconcile import T0, Rig, _job_state, rig  # noqa: F401
from tests.harness.specs import stored, typed
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import SlurmConfig
from weave_slurm.daemon.job_terms import JobTerms
from weave_slurm.daemon.records import JobRow, profile_from_json, profile_to_json
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.charge import NO_CHARGE, Charge
from weave_slurm.model.profile import simple_profile


def _spec(name: str, slurm: str = "") -> str:
    return job_spec_toml(name) + (f"\n[slurm]\n{slurm}\n" if slurm else "")


def _submit(store: Store, name: str, slurm: str = "", charge: Charge = NO_CHARGE) -> int:
    profile = replace(simple_profile(name, 10, 10, 1.5), charge=charge)
    return store.add_job(uid=1000, user="alice", name=name, **stored(name, _spec(name, slurm)),
                         source=f"{name}.toml", now=T0, profile=profile)


def _flags(argv: tuple[str, ...]) -> set[str]:
    return {a for a in argv if a.startswith(("--account", "--qos", "--time"))}


def test_allocations_carry_the_jobs_account_qos_and_time(rig: Rig) -> None:  # noqa: F811
    job = _submit(rig.store, "a", 'account = "physics"\nqos = "high"\ntime_limit_min = 30',
                  Charge("physics", "high"))
    rig.tick()
    assert _job_state(rig.store, job) is JobState.RUNNING
    assert [_flags(a) for a in rig.argvs("sbatch")] == \
        [{"--account=physics", "--qos=high", "--time=30"}] * 2
    assert {(a.account, a.qos, a.time_limit_min) for a in rig.alloc_rows()} == \
        {("physics", "high", 30)}


def test_a_job_naming_none_gets_slurms_default(rig: Rig) -> None:  # noqa: F811
    _submit(rig.store, "a")
    rig.tick()
    assert [_flags(a) for a in rig.argvs("sbatch")] == [set(), set()]


def test_jobs_of_two_accounts_get_two_groups_each_charged_its_own(rig: Rig) -> None:  # noqa: F811
    a = _submit(rig.store, "a", 'account = "physics"', Charge("physics"))
    b = _submit(rig.store, "b", 'account = "bio"', Charge("bio"))
    rig.tick()
    groups = {rig.store.job(j).group_id for j in (a, b)}  # type: ignore[union-attr]
    assert len(groups) == 2
    accounts = sorted(f for argv in rig.argvs("sbatch") for f in _flags(argv))
    assert accounts == ["--account=bio"] * 2 + ["--account=physics"] * 2


def test_a_job_is_ended_once_it_has_run_its_time_limit(rig: Rig) -> None:  # noqa: F811
    job = _submit(rig.store, "a", "time_limit_min = 2")
    other = _submit(rig.store, "b")
    rig.tick()
    assert _job_state(rig.store, job) is JobState.RUNNING
    started = rig.store.job(job).started_s  # type: ignore[union-attr]
    assert started is not None
    rig.tick(at=started + 119.0)
    assert _job_state(rig.store, job) is JobState.RUNNING
    rig.tick(at=started + 120.0)
    row = rig.store.job(job)
    assert row is not None and row.state is JobState.FAILED and row.ended_s == started + 120
    assert row.reason.startswith("reached its time limit (2 min, #SBATCH --time; ran 2.0 min)")
    assert "TIMEOUT" in row.reason
    assert _job_state(rig.store, other) is JobState.RUNNING   # no limit of its own
    assert not rig.store.steps(job_id=job)   # its idle steps were stopped


def test_the_group_allocation_outlasts_its_longest_member_or_takes_the_sites() -> None:
    terms = JobTerms()

    def row(job_id: int, slurm: str, started_s: float | None) -> JobRow:
        return JobRow(job_id, 1000, "alice", "j", *typed(_spec("j", slurm)), "j.toml",
                      simple_profile("j", 10, 10, 1.5), JobState.RUNNING, "", 1, 0.0,
                      started_s, None)

    a, b = row(1, "time_limit_min = 30", 0.0), row(2, "time_limit_min = 10", None)
    site = SlurmConfig(account="lab")
    assert terms.alloc_terms(site, [a, b], now=600.0).time_limit_min == 20   # 30 - 10 run
    assert terms.alloc_terms(site, [a, b], now=1500.0).time_limit_min == 10  # b: all left
    assert terms.alloc_terms(site, [a, row(3, "", 0.0)], 0.0).time_limit_min is None
    assert terms.alloc_terms(replace(site, time_limit_min=90), [a, b], 0.0).time_limit_min == 90
    assert terms.alloc_terms(site, [a], 0.0).account == "lab"   # the site's when none


def test_a_profile_keeps_its_charge_through_the_store() -> None:
    p = replace(simple_profile("j", 10, 10, 1.5), charge=Charge("physics", "high"))
    assert profile_from_json(profile_to_json(p)) == p
    old = json.loads(profile_to_json(simple_profile("j", 10, 10, 1.5)))
    del old["charge"]   # a row an older weaved wrote
    assert profile_from_json(json.dumps(old)).charge == Charge()


@pytest.mark.parametrize("minutes", [1, 5])
def test_remaining_minutes(minutes: int) -> None:
    terms = JobTerms()
    job = JobRow(1, 1000, "a", "j", *typed(_spec("j", f"time_limit_min = {minutes}")),
                 "j.toml",
                 simple_profile("j", 10, 10, 1.5), JobState.RUNNING, "", 1, 0.0, 100.0, None)
    assert terms.remaining_min(job, 100.0 + 30) == pytest.approx(minutes - 0.5)
    assert terms.overdue([job], 100.0 + minutes * 60 - 1) == []
    assert [j.job_id for j, _ in terms.overdue([job], 100.0 + minutes * 60)] == [1]
